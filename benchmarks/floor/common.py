"""What the floor servers share: the lab's settings and supervisor, minus TLS and /metrics."""

import orjson

from services.common.config import ConfigError, ResponseModel, Settings, load_settings
from services.common.records import RecordSource
from services.common.rest import RecordBodies
from services.common.supervisor import WorkerMain, main_guard, run_service


def floor_settings(service: str) -> Settings:
    """The lab service's settings (its env and default ports); the floors serve cleartext only."""
    settings = load_settings(service)
    if settings.tls:
        raise ConfigError("the floor servers serve cleartext only: unset TLS_CERT_FILE and TLS_KEY_FILE")
    return settings


def serve(service: str, settings_of: str, worker_main: WorkerMain) -> None:
    """Run worker_main in the lab's supervisor (forked workers sized from the cgroup quota, the
    listening line, SIGTERM forwarded), without its /metrics server: the supervisor does no
    per-request work. Exits with the supervisor's code."""

    def run() -> int:
        return run_service(service, "floor", floor_settings(settings_of), worker_main, serve_metrics=False)

    main_guard(run)


class FloorBodies:
    """The lab's /records bodies (RecordBodies.document, encoded with orjson as the lab does), with
    query values parsed by int(): what serving needs, without the lab's stricter check."""

    def __init__(self, source: RecordSource, model: ResponseModel) -> None:
        self._source = source
        self._bodies = RecordBodies(source, model)

    def body(self, count: str | None, offset: str | None) -> bytes:
        """The body for the raw query values; ValueError (BadRequest too) for a bad value."""
        valid = self._source.validate(
            None if count is None else int(count), None if offset is None else int(offset)
        )
        return orjson.dumps(self._bodies.document(*valid))
