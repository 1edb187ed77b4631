"""Shutdown of every service under load: SIGTERM during a real k6 run, a second SIGTERM, and the
end of the grace period.

tests/integration/test_rest_services.py and test_grpc_processes.py already show in-flight requests
completing through a SIGTERM with Python clients; here k6 (as the runner drives it) keeps
sending through the whole stop, and clients that never finish reading hold requests in flight
so that only a second signal or the grace period can end the process.
"""

import contextlib
import functools
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labrunner.run.k6.binary import find_k6

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.support import GRPC_SERVERS, REST_SERVERS, ROOT, RunningService, k6_env, launch_service

DRAIN_S = 1.0
GRACE_S = 5.0
K6_VUS = 10
K6_DURATION = "4s"
SIGTERM_AFTER_S = 1.5  # into the k6 run
FAIL_FAST_MS = 1000  # a request refused during the stop must not hang
# What a supervisor (services/common/supervisor.py, Hypercorn's in services/rest_quart/server.py) logs
# when it kills its workers on a second signal, and what it or a worker logs when the grace period ends.
SECOND_SIGNAL = "second stop signal: killing workers now"
GRACE_OVER = "grace period over"
STUCK = 5  # requests held in flight by clients that do not read
# A response this large outgrows every socket buffer and HTTP/2 window, so a client that
# does not read keeps its request in flight on the server.
HUGE_COUNT = 100_000
SCRIPTS = {**dict.fromkeys(REST_SERVERS, "k6/rest.js"), **dict.fromkeys(GRPC_SERVERS, "k6/grpc_unary.js")}
MODULES = list(SCRIPTS)

# The stops with stuck requests judge what ended the service (its log), two at a time; the stop under
# k6 load judges a request refused within the drain, alone.
pytestmark = [pytest.mark.timeout(90), pytest.mark.paired]


@dataclass(frozen=True)
class Sample:
    """One request as k6's JSON output recorded it."""

    at: float  # epoch seconds
    duration_ms: float
    status: str  # HTTP status, or the gRPC code as a number; "0" for HTTP: no response


def _epoch(rfc3339: str) -> float:
    """k6's nanosecond timestamps ("...:04.70596123Z") as epoch seconds."""
    whole, _, fraction = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{fraction or 0}")


def k6_samples(path: Path, grpc_target: bool) -> list[Sample]:
    metric = "grpc_req_duration" if grpc_target else "http_req_duration"
    samples = []
    with path.open() as lines:
        for line in lines:
            point = json.loads(line)
            if point.get("type") == "Point" and point["metric"] == metric:
                data = point["data"]
                at = _epoch(data["time"])
                samples.append(Sample(at, data["value"], data["tags"].get("status", "")))
    return samples


def http_health(port: int) -> str:
    response = httpx.get(
        f"http://127.0.0.1:{port}/healthz", headers={"connection": "close"}, timeout=2, trust_env=False
    )
    return response.json()["status"]


def grpc_health(port: int) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


@contextmanager
def health_watch(check: Callable[[], str]) -> Iterator[list[tuple[float, str]]]:
    """(epoch seconds, SERVING | NOT_SERVING | refused) every 20 ms, on a fresh connection each time."""
    seen: list[tuple[float, str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                outcome = check()
            except (httpx.TransportError, grpc.RpcError):
                outcome = "refused"
            seen.append((time.time(), outcome))
            stop.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=5)


def start_k6(module: str, port: int, out: Path) -> subprocess.Popen[str]:
    load = {"LOAD_MODEL": "constant-vus", "VUS": str(K6_VUS), "DURATION": K6_DURATION, "COUNT": "100"}
    env = k6_env(port, module in GRPC_SERVERS, **load)
    command = [str(find_k6(None)), "run", "--quiet", "--no-color", "--address", "", "--out", f"json={out}"]
    return subprocess.Popen(
        [*command, str(ROOT / SCRIPTS[module])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.serial  # k6 load through the stop
@pytest.mark.parametrize("module", MODULES)
def test_sigterm_under_k6_load(tmp_path: Path, module: str) -> None:
    env = {"SHUTDOWN_DRAIN_SECONDS": str(DRAIN_S), "SHUTDOWN_GRACE_SECONDS": str(GRACE_S)}
    service = launch_service(module, env)
    grpc_target = module in GRPC_SERVERS
    check = grpc_health if grpc_target else http_health
    out = tmp_path / "k6.json"
    try:
        k6 = start_k6(module, service.port, out)
        with health_watch(lambda: check(service.port)) as health:
            time.sleep(SIGTERM_AFTER_S)
            signalled = time.time()
            service.process.send_signal(signal.SIGTERM)
            exit_code = service.process.wait(timeout=DRAIN_S + GRACE_S + 3)
            stopped = time.time()
            time.sleep(0.2)  # a few refusals after the exit
        output, _ = k6.communicate(timeout=60)
    finally:
        service.kill()
    assert exit_code == 0, "a graceful stop exits 0"
    assert stopped - signalled >= DRAIN_S, "the service stopped before its drain ended"

    # Health said NOT_SERVING after the signal and before anything was refused.
    before = [outcome for at, outcome in health if at < signalled]
    after = [outcome for at, outcome in health if at > signalled + 0.05]
    assert before and set(before) == {"SERVING"}, before
    assert "NOT_SERVING" in after and "refused" in after, after
    assert after.index("NOT_SERVING") < after.index("refused"), after
    assert set(after[after.index("refused") :]) == {"refused"}, "health came back after the stop"

    samples = k6_samples(out, grpc_target)
    ok = "0" if grpc_target else "200"
    assert len(samples) > 100, output[-2000:]
    # In flight at the signal, or sent during the drain: all answered in full.
    served_window = signalled + DRAIN_S - 0.2
    early = [s for s in samples if s.at < served_window]
    assert early and {s.status for s in early} == {ok}, {s.status for s in early}
    # After the drain, new requests are refused, quickly and never with a server error.
    refused = [s for s in samples if s.status != ok]
    assert refused, "k6 kept being served after the service stopped"
    # gRPC: UNAVAILABLE once the client saw GOAWAY, CANCELLED for calls that reached grpc core after
    # the stop began and before GOAWAY arrived (no handler ever ran); HTTP: no response at all.
    expected_refusal = {"1", "14"} if grpc_target else {"0"}
    assert {s.status for s in refused} <= expected_refusal, {s.status for s in refused}
    assert max(s.duration_ms for s in refused) < FAIL_FAST_MS, max(s.duration_ms for s in refused)
    assert min(s.at for s in refused) > signalled + DRAIN_S - 0.2, "refused before the drain ended"


def _session_alive(session: int) -> list[str]:
    """Command lines of the service's session still running (launch_service starts a new session)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(after_name[3]) == session and after_name[0] != "Z":
            alive.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return alive


def session_left_after(session: int, timeout: float = 2.0) -> list[str]:
    """What of the session is still running once it had timeout seconds to go (the resource
    tracker of Hypercorn's multiprocessing exits a moment after the supervisor)."""
    deadline = time.monotonic() + timeout
    while (alive := _session_alive(session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _cut_short(held: grpc.Future | socket.socket) -> bool:
    """Whether a held request ended without its whole response, once its server is gone: a gRPC
    stream with a status other than OK, a REST response whose body stops before its end."""
    if isinstance(held, socket.socket):
        tail = b""
        held.settimeout(10)
        try:
            while chunk := held.recv(1 << 20):
                tail = (tail + chunk)[-16:]
        except ConnectionResetError:
            return True
        return not tail.endswith((b"]}", b"0\r\n\r\n"))  # the records' end, or a chunked body's
    # What the transport buffered, then the stream's end: its status arrives after the messages
    # before it, so asking for the code without reading them waits for the call's deadline.
    with contextlib.suppress(grpc.RpcError):
        for _ in held:
            pass
    return held.code() != grpc.StatusCode.OK


@contextmanager
def requests_held_in_flight(module: str, port: int) -> Iterator[list[Callable[[], bool]]]:
    """STUCK requests for HUGE_COUNT records from clients that read the first bytes and stop; yields,
    for each, whether it was cut short (ask once the service has exited)."""
    held: list[Callable[[], bool]] = []
    with ExitStack() as stack:
        for _ in range(STUCK):
            if module in GRPC_SERVERS:
                channel = stack.enter_context(
                    grpc.insecure_channel(
                        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
                    )
                )
                stream = cars_pb2_grpc.RecordServiceStub(channel).StreamRecords(
                    cars_pb2.ListRecordsRequest(count=HUGE_COUNT), timeout=60
                )
                next(stream)  # started; the rest waits for a reader that never comes
                stack.callback(stream.cancel)
                held.append(functools.partial(_cut_short, stream))
            else:
                sock = stack.enter_context(socket.socket())
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(f"GET /records?count={HUGE_COUNT}&offset=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert sock.recv(16).startswith(b"HTTP/1.1 200")
                held.append(functools.partial(_cut_short, sock))
        yield held


def start_with_stuck_requests(
    module: str, grace_s: float, drain_s: float, log: Path
) -> tuple[RunningService, ExitStack, list[Callable[[], bool]]]:
    """The service with STUCK requests held in flight (and whether each was cut short), its log
    (stderr) written to log."""
    env = {
        "MAX_COUNT": str(HUGE_COUNT),
        "SHUTDOWN_DRAIN_SECONDS": str(drain_s),
        "SHUTDOWN_GRACE_SECONDS": str(grace_s),
    }
    stack = ExitStack()
    service = launch_service(module, env, stderr=stack.enter_context(log.open("w")))
    stack.callback(service.kill)
    held = stack.enter_context(requests_held_in_flight(module, service.port))
    return service, stack, held


@pytest.mark.parametrize("module", MODULES)
def test_a_second_sigterm_ends_the_service_at_once(module: str, tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    service, stack, _ = start_with_stuck_requests(module, grace_s=30, drain_s=0.2, log=log)
    with stack:
        service.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert service.process.poll() is None, (
            "the stuck requests should hold the service in its grace period"
        )
        service.process.send_signal(signal.SIGTERM)
        exit_code = service.process.wait(timeout=20)  # only ends a hung test: the grace is 30 s
        assert exit_code != 0, "killed workers are no clean stop"
        assert not session_left_after(service.process.pid), "a worker outlived its supervisor"
    # What ended it: the second signal, not the grace period running out.
    text = log.read_text()
    assert SECOND_SIGNAL in text and GRACE_OVER not in text, text


@pytest.mark.parametrize("module", MODULES)
def test_the_end_of_the_grace_period_ends_the_service(module: str, tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    service, stack, held = start_with_stuck_requests(module, grace_s=1.0, drain_s=0.2, log=log)
    with stack:
        service.process.send_signal(signal.SIGTERM)  # one signal: only the grace period can end it
        service.process.wait(timeout=30)  # only ends a hung test
        assert not session_left_after(service.process.pid), "a worker outlived its supervisor"
        # What ended it: the grace period ran out and cut the requests still in flight (their
        # clients never read, so none could finish), not a second signal.
        assert [cut() for cut in held] == [True] * STUCK
    assert SECOND_SIGNAL not in log.read_text(), log.read_text()
