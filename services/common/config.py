"""Service settings from environment variables, every knob and its default: the ones a floor reads
too (the workload) in services.common.environment, the rest here."""

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from services.common.environment import ConfigError, env_bool, env_float, env_int, read_workload
from services.common.pool import DEFAULT_SHAPE
from services.common.stacks import STACKS
from services.common.user_message import UserMessageError, install

SECONDS = 1.0


class ResponseModel(StrEnum):
    """How a server makes the protocol's objects of a response (RESPONSE_MODEL), the same on every server.

    BUILD: every request maps its records from the neutral form (services.common.records.Record)
    into the protocol's objects (dicts for JSON, protobuf messages for gRPC) and serializes
    them; nothing built for one request is reused by another.
    PREBUILT: the per-record protocol objects are built once at start; a request only
    assembles and serializes them (the wire-only cost).
    """

    BUILD = "build"
    PREBUILT = "prebuilt"


def _response_model(record_mode: str) -> ResponseModel:
    raw = os.environ.get("RESPONSE_MODEL", "").strip() or ResponseModel.BUILD
    try:
        model = ResponseModel(raw)
    except ValueError:
        raise ConfigError(f"RESPONSE_MODEL={raw!r} must be 'build' or 'prebuilt'") from None
    if model is ResponseModel.PREBUILT and record_mode == "live":
        # Live records are new on every request: there is nothing to build once.
        raise ConfigError("RESPONSE_MODEL=prebuilt needs RECORD_MODE=pool (live records are new per request)")
    return model


# What a server compresses its responses with when the client accepts it (COMPRESSION): identity
# sends them as they are. REST compresses the /records body (services.common.rest.ResponseEncoding),
# grpc.aio every response message; grpclib and the floor servers cannot.
IDENTITY, GZIP = "identity", "gzip"
COMPRESSIONS = (IDENTITY, GZIP)
COMPRESSING_SERVICES = ("rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio")
# What serves HTTP/3 beside its TCP listener (HTTP3): Hypercorn, through aioquic.
HTTP3_SERVICES = ("rest_quart",)


@dataclass(frozen=True)
class Settings:
    """Everything a service reads from its environment, with units in the names."""

    host: str
    port: int
    metrics_port: int
    metrics_enabled: bool
    workers: int | None  # None: derive from the cgroup CPU quota
    tls_cert_file: Path | None
    tls_key_file: Path | None
    alpn_protocols: tuple[str, ...]
    record_pool_size: int
    record_seed: int
    record_mode: str  # "pool" or "live"
    response_model: ResponseModel
    shape: str  # the record shape served (SHAPE), services.common.shapes
    default_count: int
    max_count: int
    # The largest request body (REST, else 413) or message (gRPC, else RESOURCE_EXHAUSTED).
    max_request_bytes: int
    shutdown_drain_seconds: float
    shutdown_grace_seconds: float
    grpc_max_concurrent_rpcs: int | None
    compression: str = IDENTITY  # COMPRESSIONS
    http3: bool = False  # HTTP3: also serve HTTP/3 over QUIC, on UDP at the TCP port's number
    gc_freeze: bool = True  # GC_FREEZE: the start-up heap frozen out of collections (services.common.heap)

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


# Each implementation's (port, metrics port) when PORT / METRICS_PORT are unset, as its stack declares
# them; docker-compose.yml builds its images with the same numbers (tests/unit/test_stacks.py checks).
DEFAULT_PORTS: dict[str, tuple[int, int]] = {s.package: (s.port, s.metrics_port) for s in STACKS}


def load_settings(service: str) -> Settings:
    """Read the settings of one implementation; a bad value raises ConfigError naming the variable."""
    default_port, default_metrics_port = DEFAULT_PORTS[service]
    cert = os.environ.get("TLS_CERT_FILE", "").strip()
    key = os.environ.get("TLS_KEY_FILE", "").strip()
    if bool(cert) != bool(key):
        raise ConfigError("TLS_CERT_FILE and TLS_KEY_FILE must be set together")
    for name, value in (("TLS_CERT_FILE", cert), ("TLS_KEY_FILE", key)):
        if value and not Path(value).is_file():
            raise ConfigError(f"{name}={value} does not exist (run scripts/gen_certs.py)")
    record_mode = os.environ.get("RECORD_MODE", "pool").strip() or "pool"
    if record_mode not in {"pool", "live"}:
        raise ConfigError(f"RECORD_MODE={record_mode!r} must be 'pool' or 'live'")
    response_model = _response_model(record_mode)
    work = read_workload()
    if record_mode == "live" and work.shape != DEFAULT_SHAPE:
        raise ConfigError(f"RECORD_MODE=live serves cars only, not SHAPE={work.shape}")
    if work.shape_dir is not None:
        try:  # the user's message becomes this process's shape `proto`, before any server asks for it
            install(work.shape_dir)
        except UserMessageError as error:
            raise ConfigError(f"SHAPE_DIR={work.shape_dir}: {error}") from None
    alpn = tuple(p.strip() for p in os.environ.get("ALPN_PROTOCOLS", "h2,http/1.1").split(",") if p.strip())
    if not alpn or not set(alpn) <= {"h2", "http/1.1"}:
        raise ConfigError(f"ALPN_PROTOCOLS={alpn!r} must list h2 and/or http/1.1")
    compression = os.environ.get("COMPRESSION", "").strip() or IDENTITY
    if compression not in COMPRESSIONS:
        raise ConfigError(f"COMPRESSION={compression!r} must be one of {', '.join(COMPRESSIONS)}")
    if compression != IDENTITY and service not in COMPRESSING_SERVICES:
        raise ConfigError(f"COMPRESSION={compression}: {service} cannot compress its responses")
    http3 = env_bool("HTTP3", False)
    if http3 and service not in HTTP3_SERVICES:
        raise ConfigError(f"HTTP3=1: {service} cannot serve HTTP/3 (only {', '.join(HTTP3_SERVICES)} can)")
    if http3 and not cert:
        raise ConfigError("HTTP3=1 needs TLS_CERT_FILE and TLS_KEY_FILE: QUIC is always encrypted")
    workers = env_int("WORKERS", 0)
    max_rpcs = env_int("GRPC_MAX_CONCURRENT_RPCS", 0)
    return Settings(
        host=work.host,
        port=env_int("PORT", default_port),
        metrics_port=env_int("METRICS_PORT", default_metrics_port),
        metrics_enabled=env_bool("METRICS_ENABLED", True),
        workers=workers or None,
        tls_cert_file=Path(cert) if cert else None,
        tls_key_file=Path(key) if key else None,
        alpn_protocols=alpn,
        record_pool_size=work.record_pool_size,
        record_seed=work.record_seed,
        record_mode=record_mode,
        response_model=response_model,
        shape=work.shape,
        default_count=work.default_count,
        max_count=work.max_count,
        max_request_bytes=work.max_request_bytes,
        shutdown_drain_seconds=env_float("SHUTDOWN_DRAIN_SECONDS", 0.5 * SECONDS),
        shutdown_grace_seconds=env_float("SHUTDOWN_GRACE_SECONDS", 10 * SECONDS),
        grpc_max_concurrent_rpcs=max_rpcs or None,
        compression=compression,
        http3=http3,
        gc_freeze=work.gc_freeze,
    )
