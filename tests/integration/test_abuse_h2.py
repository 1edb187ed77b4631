"""The abuse suite's HTTP/2 cases, on every HTTP/2 server and floor, each in its cgroup at the small
profile's limits: a rapid-reset flood (CVE-2023-44487) from 2 connections while /healthz (or gRPC health)
is asked on another connection (cleartext HTTP/2 against the servers that offer HTTP/1.1 only:
test_abuse_rest.py). The service stays alive, under its memory limit and serving; the health checks
during the flood all answer, and their latencies are printed, not asserted (a busy 2-vCPU host:
docs/guarantees.md has the figures)."""

import time
from collections.abc import Callable

import grpc
import h2.events
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.abuse_support import Flood, RawH2, client_ssl_context, confined
from tests.support import tls_env

FLOOD_SECONDS = 4.0
HEALTH_EVERY_SECONDS = 0.2
# (id, package, module, TLS): every HTTP/2 server; REST's HTTP/2 is TLS (ALPN) only. The floors of the
# REST servers serve HTTP/1.1 only (floor-*-h1), so only the gRPC floors take the flood.
FLOODED = [
    ("lab-rest_quart", "services", "rest_quart", True),
    ("lab-rest_granian", "services", "rest_granian", True),
    ("lab-grpc_aio", "services", "grpc_aio", False),
    ("lab-grpc_grpclib", "services", "grpc_grpclib", False),
    ("floor-grpc_aio", "benchmarks.floor", "grpc_aio", False),
    ("floor-grpc_grpclib", "benchmarks.floor", "grpc_grpclib", False),
]

pytestmark = [pytest.mark.timeout(120), pytest.mark.paired]  # servers under CPU quotas, no figure judged


def _health_check(port: int, grpc_server: bool, tls: bool) -> Callable[[], None]:
    def grpc_health() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    def rest_health() -> None:
        verify = client_ssl_context(["http/1.1"]) if tls else True
        scheme = "https" if tls else "http"
        answer = httpx.get(f"{scheme}://localhost:{port}/healthz", verify=verify, timeout=10, trust_env=False)
        assert answer.status_code == 200

    return grpc_health if grpc_server else rest_health


@pytest.mark.serial  # a flood whose health checks must each answer within 10 s: alone
@pytest.mark.parametrize(("package", "module", "tls"), [f[1:] for f in FLOODED], ids=[f[0] for f in FLOODED])
def test_a_rapid_reset_flood_leaves_health_answering(package: str, module: str, tls: bool) -> None:
    grpc_server = module.startswith("grpc")
    with confined(package, module, tls_env() if tls else None) as server:
        port = server.service.port
        check = _health_check(port, grpc_server, tls)
        path = "/protolab.cars.v1.RecordService/ListRecords" if grpc_server else "/records?count=100"
        server.reset_peak()
        latencies: list[float] = []
        with Flood(port, tls, path, grpc_server).running() as counts:
            time.sleep(1.0)  # the flood's processes start
            end = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < end:
                began = time.monotonic()
                check()  # raises if a check fails or takes over its 10 s timeout
                latencies.append(time.monotonic() - began)
                time.sleep(HEALTH_EVERY_SECONDS)
            streams, connects = counts.streams.value, counts.connects.value
        peak = server.unharmed()
        latencies.sort()
        print(
            f"\n{module} ({package}): {streams} streams reset over {connects} connections; health "
            f"{len(latencies)} checks, median {latencies[len(latencies) // 2] * 1000:.0f} ms, "
            f"worst {latencies[-1] * 1000:.0f} ms; memory peak {peak / 2**20:.0f} MiB"
        )
        assert connects > 0 and latencies, "the flood or the health checks did not run"
        check()


# (id, package, module, TLS): the servers that end a connection past its reset budget (Hypercorn and
# grpclib: services/common/h2_budget.py; Granian: hyper's own limit). grpc.aio's core throttles a
# flooding connection instead of ending it (the flood above).
BUDGETED = [f for f in FLOODED if "grpc_aio" not in f[2]]


def _reset_streams(raw: RawH2, count: int, path: str, grpc_server: bool) -> None:
    scheme = "http" if grpc_server else "https"
    headers = [(":method", "POST" if grpc_server else "GET"), (":scheme", scheme), (":path", path),
               (":authority", "localhost")]  # fmt: skip
    if grpc_server:
        headers += [("content-type", "application/grpc"), ("te", "trailers")]
    for _ in range(count):
        stream_id = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream_id, headers, end_stream=not grpc_server)
        raw.conn.reset_stream(stream_id)
    raw.flush()


def _ended_by_server(raw: RawH2, silence_seconds: float) -> bool:
    """Whether the server ends the connection (GOAWAY or close) before it is silent for silence_seconds."""
    raw.sock.settimeout(silence_seconds)
    try:
        while not raw.closed:
            if any(isinstance(event, h2.events.ConnectionTerminated) for event in raw.events()):
                return True
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(
    ("package", "module", "tls"), [b[1:] for b in BUDGETED], ids=[b[0] for b in BUDGETED]
)
def test_a_connection_past_its_reset_budget_is_ended(package: str, module: str, tls: bool) -> None:
    grpc_server = module.startswith("grpc")
    path = "/protolab.cars.v1.RecordService/ListRecords" if grpc_server else "/healthz"
    with confined(package, module, tls_env() if tls else None) as server:
        within = RawH2(server.service.port, tls=tls)
        past = RawH2(server.service.port, tls=tls)
        try:
            _reset_streams(within, 20, path, grpc_server)  # a client that cancels now and then
            _reset_streams(past, 1000, path, grpc_server)
            # The flooding connection may take a while to be read at 0.5 CPU; once it is ended, the
            # other one has been read too: 2 s of silence after that say it is kept.
            assert _ended_by_server(past, 5), "1,000 resets on one connection and the server keeps it"
            assert not _ended_by_server(within, 2), "20 resets ended the connection"
        finally:
            within.close()
            past.close()
        assert server.alive()
