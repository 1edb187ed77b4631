"""The connection model's STREAMS with real k6 against real lab servers: k6's VUs are the connections,
and each iteration sends STREAMS requests at once on its VU's one connection (k6/lib/common.js).
Counted in the kernel's TCP tables while k6 runs (labrunner.backends.connections): with STREAMS=5 a
server holds one connection per VU, no more (the requests were multiplexed), and with STREAMS=1 still
one per VU (the control: the count follows the VUs). k6 counts every request of every iteration, the
server answered each, and one in CHECK_EVERY is decoded and checked, chosen per request. In-test
servers that hold each request until STREAMS are in flight show that an iteration's requests are
in flight at once. REST over HTTP/1.1, which cannot multiplex, and a STREAMS that is no positive
integer stop k6 before any load."""

import contextlib
import json
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from labrunner.backends.connections import seen_by
from labrunner.run.k6.output import K6Metrics, parse_summary
from prometheus_client.parser import text_string_to_metric_families

from services.common.records import load_pool
from services.common.stacks import STACKS
from tests.e2e.k6_servers import (
    K6_SCRIPT_EXCEPTION,
    CountingRelay,
    GrpcServer,
    fake_record,
    hypercorn_tls,
    run_k6,
)
from tests.support import (
    CERTS,
    GRPC_SERVERS,
    RunningService,
    fixed_calls,
    k6_env,
    launch_service,
    rest_h2,
    stream_end_lost,
    tls_env,
)

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]  # answers and sockets checked, nothing measured

# (VUS, STREAMS, ITERATIONS): multiplexed, and the control, as many requests at once on a connection
# each; 480 requests either way. A fixed number of iterations, not a duration, so every count is exact;
# enough that every VU takes some (a VU connects at its first request: one that got none would hold
# no connection) and the sampler sees them all open. With STREAMS=5 and one request in CHECK_EVERY=5
# decoded, chosen per request, exactly the first of each iteration is (96 of them); had sampling chosen
# whole iterations, a VU's first and every fifth would be, at least 5 * ceil(96 / 5) = 100 requests
# whatever the VUs' split.
MODELS = {"multiplexed": (2, 5, 96), "control": (4, 1, 480)}
COUNT = 20
CHECK_EVERY = 5
SAMPLE_SECONDS = 0.05
# The REST stacks that serve HTTP/2 (over TLS, as the runner runs them), and the gRPC servers.
H2_REST_SERVERS = tuple(stack.package for stack in STACKS if "http2" in stack.protocols)
TARGETS = [("rest.js", module) for module in H2_REST_SERVERS] + [
    (script, module) for module in GRPC_SERVERS for script in ("grpc_unary.js", "grpc_stream.js")
]
# Each gRPC script's download method, and the checks of one decoded reply: status, record count and
# every field (a stream's: count and fields; an upload's: status, count and checksum).
METHODS = {"grpc_unary.js": "ListRecords", "grpc_stream.js": "StreamRecords"}
CHECKS_PER_DECODED = {"rest.js": 3, "grpc_unary.js": 3, "grpc_stream.js": 2}
GRPC_SERVICE = "protolab.cars.v1.RecordService"
POOL_SIZE, SEED = 2000, 42


@dataclass
class Served:
    script: str
    module: str
    service: RunningService


@pytest.fixture(scope="module", params=TARGETS, ids=lambda p: f"{p[0]}-{p[1]}")
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    script, module = request.param
    env = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED)}
    service = launch_service(module, env | (tls_env() if script == "rest.js" else {}))
    yield Served(script, module, service)
    assert service.stop() == 0


def env_for(served: Served, **settings: str) -> dict[str, str]:
    env = k6_env(served.service.port, grpc=served.script != "rest.js", COUNT=str(COUNT), **settings)
    if served.script == "rest.js":
        return rest_h2(env, f"https://localhost:{served.service.port}", CERTS / "ca.pem")
    return env


def fixed_run(vus: int, streams: int, iterations: int, summary: Path) -> dict[str, str]:
    return {
        **fixed_calls(iterations, vus),
        "STREAMS": str(streams),
        "CHECK_EVERY": str(CHECK_EVERY),
        "SUMMARY_FILE": str(summary),
    }


def summary_of(completed: subprocess.CompletedProcess[str], summary: Path) -> K6Metrics:
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    assert summary.is_file(), completed.stdout + completed.stderr[-2000:]
    return parse_summary(orjson.loads(summary.read_bytes()))


@contextlib.contextmanager
def connections_sampled(service: RunningService) -> Iterator[list[int]]:
    """The service's established connections, sampled every SAMPLE_SECONDS from its network namespace's
    TCP tables (/proc/<pid>/net/tcp and tcp6) until the block ends: the list of samples."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            if (seen := seen_by(service.process.pid, service.port)) is not None:
                samples.append(seen)
            done.wait(SAMPLE_SECONDS)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(timeout=5)


def served_count(service: RunningService, script: str, method: str = "GET") -> float:
    """The requests the server answered: REST's `method` /records with 200 over HTTP/2, gRPC's calls
    of the script's method started."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5).read()
    samples = [
        sample for family in text_string_to_metric_families(text.decode()) for sample in family.samples
    ]
    if script == "rest.js":
        return sum(
            sample.value
            for sample in samples
            if sample.name == "http_server_request_duration_seconds_count"
            and sample.labels["http_request_method"] == method
            and sample.labels["http_route"] == "/records"
            and sample.labels["http_response_status_code"] == "200"
            and sample.labels["network_protocol_version"] == "2"
        )
    return sum(
        sample.value
        for sample in samples
        if sample.name == "grpc_server_started_total"
        and sample.labels.get("grpc_service") == GRPC_SERVICE
        and sample.labels.get("grpc_method") == METHODS[script]
    )


def served_since(count: Callable[[], float], before: float, expected: float) -> float:
    """count() less `before`, once it is `expected` or 10 s have passed (the workers write their series
    every 0.5 s, after the client has its answer)."""
    deadline = time.monotonic() + 10
    while True:
        moved = count() - before
        if moved == expected or time.monotonic() > deadline:
            return moved
        time.sleep(0.1)


def assert_every_request_counted(
    k6: K6Metrics, script: str, streams: int, iterations: int, checks_per_decoded: int
) -> None:
    """k6 made `iterations` iterations of `streams` requests, none failed; every request was either
    decoded with all its checks passed or timed by the clock, and with streams, exactly one request an
    iteration was decoded. (A stream whose end k6 lost, stream_end_lost, is in the clock but not counted.)"""
    requests, lost = iterations * streams, stream_end_lost(script)
    assert iterations - lost <= k6.iterations <= iterations
    assert requests - lost <= k6.requests <= requests
    assert k6.errors == 0 and k6.attempts == k6.requests
    decoded, partial = divmod(k6.checks_passed, checks_per_decoded)
    assert k6.checks_failed == 0 and partial == 0 and decoded > 0
    assert abs(decoded + k6.latency_count - k6.requests) <= lost
    if streams > 1:
        assert iterations - lost <= decoded <= iterations


@pytest.mark.parametrize("model", list(MODELS))
def test_each_vu_holds_one_connection_whatever_its_streams(
    served: Served, tmp_path: Path, model: str
) -> None:
    vus, streams, iterations = MODELS[model]
    summary = tmp_path / "summary.json"
    before = served_count(served.service, served.script)
    with connections_sampled(served.service) as samples:
        completed = run_k6(served.script, env_for(served, **fixed_run(vus, streams, iterations, summary)))
    k6 = summary_of(completed, summary)
    # One connection per VU: with 5 requests at once on each (multiplexed), and with one.
    assert max(samples) == vus, samples
    assert_every_request_counted(k6, served.script, streams, iterations, CHECKS_PER_DECODED[served.script])
    # The server answered every request of every batch.
    requests = iterations * streams
    assert served_since(lambda: served_count(served.service, served.script), before, requests) == requests


@pytest.mark.parametrize("module", H2_REST_SERVERS)
def test_rest_uploads_streams_at_once_on_each_connection(tmp_path: Path, module: str) -> None:
    vus, streams, iterations = MODELS["multiplexed"]
    upload = tmp_path / "upload.json"
    upload.write_bytes(orjson.dumps({"records": load_pool(POOL_SIZE, SEED)[:COUNT]}))
    service = launch_service(
        module, {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), **tls_env()}
    )
    try:
        served = Served("rest.js", module, service)
        summary = tmp_path / "summary.json"
        settings = fixed_run(vus, streams, iterations, summary) | {
            "UPLOAD_FILE": str(upload),
            "UPLOAD_COUNT": str(COUNT),
        }
        with connections_sampled(service) as samples:
            completed = run_k6("rest.js", env_for(served, **settings))
        k6 = summary_of(completed, summary)
        assert max(samples) == vus, samples
        # Each decoded reply: status, and the count and checksum of the file's records.
        assert_every_request_counted(k6, "rest.js", streams, iterations, 3)
        # Every request was a POST of the file the server accepted, none a GET.
        requests = iterations * streams
        posts = served_since(lambda: served_count(service, "rest.js", "POST"), 0, requests)
        assert posts == requests and served_count(service, "rest.js", "GET") == 0
    finally:
        assert service.stop() == 0


# --- In flight at once on one connection: servers that hold each request until STREAMS are in flight,
# behind a relay that counts the connections k6 opens, however briefly (a 50 ms sample can miss one).

STREAMS_AT_ONCE = 7  # above k6's default batchPerHost, 6: rest.js must raise it
HOLD_SECONDS = 2.0  # what a request alone waits: sent one after another, the requests never overlap


class InFlight:
    """Holds each call (in its server thread) until STREAMS_AT_ONCE are in flight, or HOLD_SECONDS;
    `most`: the most seen in flight at once."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.in_flight = self.most = self.filled = 0

    def __call__(self) -> None:
        with self.condition:
            filled = self.filled
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if self.in_flight >= STREAMS_AT_ONCE:
                self.filled += 1
                self.condition.notify_all()
            self.condition.wait_for(lambda: self.filled > filled, timeout=HOLD_SECONDS)
            self.in_flight -= 1


@pytest.mark.parametrize("script", ["grpc_unary.js", "grpc_stream.js"])
def test_grpc_streams_are_in_flight_at_once(
    pb: tuple[ModuleType, ModuleType], tmp_path: Path, script: str
) -> None:
    in_flight = InFlight()
    summary = tmp_path / "summary.json"
    with GrpcServer(pb, gate=in_flight) as server, CountingRelay(int(server.addr.split(":")[1])) as relay:
        env = k6_env(relay.port, grpc=True, COUNT="7", **fixed_run(1, STREAMS_AT_ONCE, 3, summary))
        k6 = summary_of(run_k6(script, env), summary)
    assert k6.errors == 0 and k6.requests >= 3 * STREAMS_AT_ONCE - stream_end_lost(script)
    # One VU: only its own iteration's calls can overlap, and all of them did, on its one connection.
    assert in_flight.most == STREAMS_AT_ONCE
    assert relay.accepted == 1


# Hypercorn over TLS (h2 by ALPN) whose app holds each request as InFlight does; GET /most says the most.
HELD_APP = """
import asyncio
import json
from urllib.parse import parse_qs

RECORD = json.loads({record!r})
STREAMS, HOLD_SECONDS = {streams}, {hold}
state = {{"in_flight": 0, "most": 0, "filled": 0}}
condition = None


async def hold():
    global condition
    condition = condition or asyncio.Condition()
    async with condition:
        filled = state["filled"]
        state["in_flight"] += 1
        state["most"] = max(state["most"], state["in_flight"])
        if state["in_flight"] >= STREAMS:
            state["filled"] += 1
            condition.notify_all()
        try:
            await asyncio.wait_for(condition.wait_for(lambda: state["filled"] > filled), HOLD_SECONDS)
        except TimeoutError:
            pass
        state["in_flight"] -= 1


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/most":
        body = str(state["most"]).encode()
    else:
        await hold()
        count = int(parse_qs(scope["query_string"].decode()).get("count", ["100"])[0])
        body = json.dumps({{"records": [RECORD] * count}}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({{"type": "http.response.start", "status": 200, "headers": headers}})
    await send({{"type": "http.response.body", "body": body}})
"""


def test_rest_streams_are_in_flight_at_once(tmp_path: Path, tls_material: tuple[Path, Path, Path]) -> None:
    ca = tls_material[0]
    (tmp_path / "held.py").write_text(
        HELD_APP.format(record=json.dumps(fake_record(0)), streams=STREAMS_AT_ONCE, hold=HOLD_SECONDS)
    )
    with hypercorn_tls(tmp_path, "held:app", tls_material) as port:
        summary = tmp_path / "summary.json"
        with CountingRelay(port) as relay:
            env = k6_env(relay.port, grpc=False, COUNT="7", **fixed_run(1, STREAMS_AT_ONCE, 3, summary))
            k6 = summary_of(run_k6("rest.js", rest_h2(env, f"https://127.0.0.1:{relay.port}", ca)), summary)
        context = ssl.create_default_context(cafile=str(ca))
        most = int(
            urllib.request.urlopen(f"https://127.0.0.1:{port}/most", context=context, timeout=5).read()
        )
    assert k6.errors == 0 and k6.requests == 3 * STREAMS_AT_ONCE
    # One VU: only its own iteration's requests can overlap, and all of them did, on its one connection
    # (a batch that found none open would have had Go dial one per request: k6/rest.js).
    assert most == STREAMS_AT_ONCE
    assert relay.accepted == 1


# --- Refused before any load ---


@pytest.fixture(scope="module")
def http1_service() -> Iterator[RunningService]:
    service = launch_service("rest_aiohttp")
    yield service
    assert service.stop() == 0


def test_rest_over_http1_refuses_streams(http1_service: RunningService, tmp_path: Path) -> None:
    settings = fixed_run(1, 2, 4, tmp_path / "summary.json")
    env = k6_env(http1_service.port, grpc=False, **settings)
    refused = run_k6("rest.js", env)
    assert refused.returncode == K6_SCRIPT_EXCEPTION, refused.stdout + refused.stderr[-2000:]
    assert (
        "protolab: HTTP/1.1 cannot multiplex: STREAMS=2 needs HTTP/2 "
        "(its comparable is 2 connections: VUS x 2, STREAMS=1)"
    ) in refused.stderr
    # The same run with STREAMS=1 passes: the refusal is the streams'.
    assert summary_of(run_k6("rest.js", env | {"STREAMS": "1"}), tmp_path / "summary.json").requests == 4


@pytest.mark.parametrize("streams", ["0", "x"])
@pytest.mark.parametrize("script", ["rest.js", "grpc_unary.js", "grpc_stream.js"])
def test_streams_that_is_no_positive_integer_stops_k6(script: str, streams: str) -> None:
    # No server: k6 stops in its init code, before it connects anywhere.
    env = k6_env(1, grpc=script != "rest.js", STREAMS=streams, VUS="1", DURATION="1s")
    completed = run_k6(script, env)
    assert completed.returncode == K6_SCRIPT_EXCEPTION, completed.stdout + completed.stderr[-2000:]
    assert f"protolab: env STREAMS={streams} is not a positive integer" in completed.stderr
