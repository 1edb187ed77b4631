"""What the floor servers share: their settings, records and process layout, none of the lab's serving code.

A floor server is the least a skilled engineer would run for the lab's contract: the same records
and bytes on the wire and the same answers to bad input, nothing else. It reads the lab's settings
by name (the ones that decide the work: HOST, PORT, WORKERS, RECORD_POOL_SIZE, RECORD_SEED,
DEFAULT_COUNT, MAX_COUNT, MAX_REQUEST_BYTES, RESPONSE_MODEL, SHAPE, GC_FREEZE), takes the record pool's data
(services.common.pool's load_pool, the JSON every lab server starts from) and holds each record as
one flat tuple. Its process is the server itself: no supervisor; with more than one worker (a quota
above one CPU), the first process forks the others, which share the port through SO_REUSEPORT.

From the lab it takes only what is not serving: the pool's data, the worker count the lab derives
from the cgroup quota, the environment's parser and defaults (services.common.environment) and the
interpreter's description for the listening line (docs/CONTRACTS.md).
import-linter (pyproject.toml) holds that.
"""

import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
from google.protobuf.message import Message

from services.common import heap, interpreter
from services.common.cgroup import worker_count
from services.common.environment import ConfigError, env_int, read_workload
from services.common.pool import load_pool

# make, model, trim, color, year, mileage, firstname, lastname, driver_id: the proto's order.
FlatRecord = tuple[str, str, str, str, int, int, str, str, str]
Flat = tuple[Any, ...]  # a record of any shape (benchmarks/floor/shapes.py), as one flat tuple
# Equal to the lab servers' (services/common/rest.py): the same connection storm queued.
LISTEN_BACKLOG = 1024
KEEP_ALIVE_TIMEOUT_SECONDS = 75.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class FloorShape:
    """One record shape as the floor serves it (benchmarks/floor/shapes.py's FLOOR_SHAPES)."""

    service: str  # the gRPC service's full name
    record_message: type[Message]
    list_message: type[Message]
    create_message: type[Message]
    flat: Callable[[dict[str, Any]], Flat]  # the pool's JSON record -> its flat tuple
    documents: Callable[[Sequence[Flat]], list[dict[str, Any]]]  # flat tuples -> the body's records
    fill: Callable[[Any, Flat], Any]  # (a record message, a flat tuple) -> the message, filled
    from_message: Callable[[Any], Flat]  # an upload's record message -> its flat tuple
    checksum: Callable[[Sequence[Flat]], int]
    records_of_body: Callable[[bytes, int], list[Flat]]  # a REST upload's body -> flat tuples, or BadRequest


class BadRequest(ValueError):
    """A request value out of the contract; the message is the lab's, word for word."""


@dataclass(frozen=True)
class FloorSettings:
    service: str  # e.g. floor_rest_aiohttp, in the listening line
    host: str
    port: int
    workers: int
    pool_size: int
    seed: int
    default_count: int
    max_count: int
    max_request_bytes: int  # the largest upload body (REST) or message (gRPC)
    prebuilt: bool  # RESPONSE_MODEL=prebuilt: the protocol's objects built once at start
    shape: str  # SHAPE: the record served (benchmarks/floor/shapes.py)
    gc_freeze: bool  # GC_FREEZE: the start-up heap out of collections, as in the lab (services.common.heap)

    @property
    def response_model(self) -> str:
        return "prebuilt" if self.prebuilt else "build"


def _refuse(message: str) -> NoReturn:
    print(f"configuration error: {message}", file=sys.stderr)
    sys.exit(2)


def floor_settings(service: str) -> FloorSettings:
    """The settings from the environment, with the lab's defaults; exit 2 on what a floor does not serve."""
    if os.environ.get("TLS_CERT_FILE", "").strip():
        _refuse("the floor servers serve cleartext only: unset TLS_CERT_FILE and TLS_KEY_FILE")
    if os.environ.get("RECORD_MODE", "pool").strip() not in {"", "pool"}:
        _refuse("the floor servers serve the record pool only (RECORD_MODE=pool)")
    model = os.environ.get("RESPONSE_MODEL", "").strip() or "build"
    if model not in {"build", "prebuilt"}:
        _refuse(f"RESPONSE_MODEL={model!r} must be 'build' or 'prebuilt'")
    try:  # the lab's own parser and defaults
        work, port, workers = read_workload(), env_int("PORT", 0), env_int("WORKERS", 0)
    except ConfigError as exc:
        _refuse(str(exc))
    return FloorSettings(
        service=service,
        host=work.host,
        port=port,
        workers=workers or worker_count(),
        pool_size=work.record_pool_size,
        seed=work.record_seed,
        default_count=work.default_count,
        max_count=work.max_count,
        max_request_bytes=work.max_request_bytes,
        prebuilt=model == "prebuilt",
        shape=work.shape,
        gc_freeze=work.gc_freeze,
    )


class Records:
    """The pool of the shape as flat tuples (flat: one JSON record's tuple), served by (count, offset): a
    response is one slice of a window that repeats the pool's first max_count records, and without
    offset the server rotates through it."""

    def __init__(self, settings: FloorSettings, flat: Callable[[dict[str, Any]], tuple[Any, ...]]) -> None:
        pool = [flat(record) for record in load_pool(settings.pool_size, settings.seed, settings.shape)]
        self.pool = pool
        self.window = pool + (pool * (settings.max_count // len(pool) + 1))[: settings.max_count]
        self._size = len(pool)
        self._cursor = 0
        self._default = settings.default_count
        self._max = settings.max_count

    def start(self, count: int | None, offset: int | None) -> tuple[int, int]:
        """(start, count) in the window for a request's values; BadRequest as the lab words it."""
        if count is None:
            count = self._default
        if count < 1 or count > self._max:
            raise BadRequest(f"count must be between 1 and {self._max}, got {count}")
        if offset is None:
            offset = self._cursor
            self._cursor = (offset + count) % self._size
        elif offset < 0:
            raise BadRequest(f"offset must be >= 0, got {offset}")
        return offset % self._size, count


def query_int(name: str, raw: str | None) -> int | None:
    """A query value as the OpenAPI integer: ASCII digits after an optional "-" (int() alone takes
    " 7", "+7" and "1_000"); BadRequest as the lab words it."""
    if raw is None:
        return None
    digits = raw[1:] if raw[:1] == "-" else raw
    if digits.isdigit() and digits.isascii():
        try:
            return int(raw)
        except ValueError:  # more digits than int() takes
            pass
    raise BadRequest(f"{name} must be an integer, got {raw!r}")


def listen_socket(settings: FloorSettings, port: int) -> socket.socket:
    """A listening TCP socket; SO_REUSEPORT only when workers share the port."""
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if settings.workers > 1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((settings.host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


# serve(port, ready) runs one worker's server on port until SIGTERM; ready(bound_port) once it accepts.
Serve = Callable[[int, Callable[[int], None]], None]


def run(settings: FloorSettings, serve: Serve) -> None:
    """Serve in this process; with more workers, fork them first (before any server or event loop
    exists), print the listening line once all accept, stop them when this one stops."""
    port = settings.port
    reservation = None
    if settings.workers > 1:  # port 0 resolved once, for every worker
        reservation = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reservation.bind((settings.host, port))
        port = reservation.getsockname()[1]
    ready_read, ready_write = os.pipe()
    children = [_fork_worker(settings, serve, port, ready_write) for _ in range(settings.workers - 1)]
    os.close(ready_write)

    def ready(bound: int) -> None:
        heap.freeze_startup(settings.gc_freeze)
        for _ in children:  # one byte from each forked worker once it accepts
            if not os.read(ready_read, 1):
                _refuse("a worker exited before listening; see its error above")
        if reservation is not None:
            reservation.close()
        _print_listening(settings, bound)

    serve(port, ready)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    sys.exit(1 if failed else 0)


def _fork_worker(settings: FloorSettings, serve: Serve, port: int, ready_write: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the first process stops us
    import ctypes  # noqa: PLC0415  only the forked workers need prctl

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # never outlive the first process
    code = 0
    try:
        serve(port, lambda _bound: _signal_ready(settings, ready_write))
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)  # not the first process's exit path


def _signal_ready(settings: FloorSettings, ready_write: int) -> None:
    heap.freeze_startup(settings.gc_freeze)
    os.write(ready_write, b".")


def _print_listening(settings: FloorSettings, port: int) -> None:
    event = {
        "event": "listening",
        "service": settings.service,
        "port": port,
        "metrics_port": 0,
        "workers": settings.workers,
        "tls": False,
        "response_model": settings.response_model,
        "shape": settings.shape,
        "interpreter": {**interpreter.describe(), "gc": heap.describe(settings.gc_freeze)},
    }
    print(json.dumps(event), flush=True)


def error_body(message: str, status: int = 400) -> bytes:
    """The lab's error body: {"error": message, "status": status}."""
    return orjson.dumps({"error": message, "status": status})


def checksum(records: Sequence[FlatRecord]) -> int:
    """An upload's CreateRecordsReply.checksum: over each record, its two ints and the lengths of its
    seven strings, summed modulo 2**32 (the contract's definition, proto/cars.proto)."""
    total = 0
    for make, model, trim, color, year, mileage, firstname, lastname, driver_id in records:
        total += (
            year + mileage + len(make) + len(model) + len(trim) + len(color)
            + len(firstname) + len(lastname) + len(driver_id)
        )  # fmt: skip
    return total & 0xFFFFFFFF
