"""The abuse suite's HTTP/2 cases, on every HTTP/2 server and floor, each in its cgroup at the small
profile's limits: a rapid-reset flood (CVE-2023-44487) from 2 connections while /healthz (or gRPC health)
is asked on another connection (cleartext HTTP/2 against the servers that offer HTTP/1.1 only:
test_abuse_rest.py). The service stays alive, under its memory limit and serving; the health checks
during the flood all answer, and their latencies are printed, not asserted (a busy 2-vCPU host:
docs/guarantees.md has the figures)."""

import time
from collections.abc import Callable

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.abuse_support import MEMORY_BYTES, Flood, client_ssl_context, confined
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

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]  # a flood under CPU quotas: alone


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
        peak, hits = server.memory()
        latencies.sort()
        print(
            f"\n{module} ({package}): {streams} streams reset over {connects} connections; health "
            f"{len(latencies)} checks, median {latencies[len(latencies) // 2] * 1000:.0f} ms, "
            f"worst {latencies[-1] * 1000:.0f} ms; memory peak {peak / 2**20:.0f} MiB"
        )
        assert connects > 0 and latencies, "the flood or the health checks did not run"
        assert server.alive() and peak < MEMORY_BYTES and hits == 0, (peak, hits)
        check()
