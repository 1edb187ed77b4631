"""The abuse suite's slow clients on the servers tests/integration/test_slow_clients.py does not start
(Granian, grpclib and every floor), each in its cgroup at the small profile's limits: 50 connections
each holding part of a request line, of the headers, of a TLS ClientHello or of the HTTP/2 preface do
not stall anyone: a health check is answered while every one of them is still open (what happened, in
that order, is asserted; no time is), and the server stays under its memory limit."""

import contextlib
import socket

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.abuse_support import client_ssl_context, confined
from tests.support import CERTS, tls_env

HALF_OPEN = 50
PARTIAL = {
    "request line": b"GET /records?cou",
    "headers": b"GET /records?count=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    "TLS ClientHello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM",
}
# (id, package, module, TLS, what its slow clients send)
SERVERS = [
    ("lab-rest_granian", "services", "rest_granian", False, ("request line", "headers", "HTTP/2 preface")),
    ("lab-rest_granian-tls", "services", "rest_granian", True, ("TLS ClientHello",)),
    ("lab-grpc_grpclib", "services", "grpc_grpclib", False, ("HTTP/2 preface",)),
    ("lab-grpc_grpclib-tls", "services", "grpc_grpclib", True, ("TLS ClientHello",)),
    *(
        (f"floor-{module}", "benchmarks.floor", module, False, ("request line", "headers", "HTTP/2 preface"))
        for module in ("rest_aiohttp", "rest_quart", "rest_granian")
    ),
    *(
        ("floor-" + module, "benchmarks.floor", module, False, ("HTTP/2 preface",))
        for module in ("grpc_aio", "grpc_grpclib")
    ),
]

pytestmark = [pytest.mark.timeout(120), pytest.mark.paired]  # servers under CPU quotas, no figure judged


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True  # nothing to read and not closed
    except OSError:
        return False


@pytest.mark.parametrize(
    ("package", "module", "tls", "kinds"), [s[1:] for s in SERVERS], ids=[s[0] for s in SERVERS]
)
def test_slow_clients_stall_no_one(package: str, module: str, tls: bool, kinds: tuple[str, ...]) -> None:
    with confined(package, module, tls_env() if tls else None) as server, contextlib.ExitStack() as held:
        server.reset_peak()
        port = server.service.port
        slow = []
        for index in range(HALF_OPEN):
            sock = held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            sock.sendall(PARTIAL[kinds[index % len(kinds)]])
            slow.append(sock)
        if module.startswith("grpc"):
            target = f"localhost:{port}"
            credentials = grpc.ssl_channel_credentials((CERTS / "ca.pem").read_bytes()) if tls else None
            with (
                grpc.secure_channel(target, credentials)
                if credentials
                else grpc.insecure_channel(target) as channel
            ):
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=30
                )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        else:
            scheme = "https" if tls else "http"
            verify = client_ssl_context(["http/1.1"]) if tls else True
            answer = httpx.get(
                f"{scheme}://localhost:{port}/healthz", verify=verify, timeout=30, trust_env=False
            )
            assert answer.status_code == 200
        still_open = sum(_still_open(sock) for sock in slow)
        print(f"\n{module} ({package}): health answered, {still_open} of {HALF_OPEN} slow clients still open")
        assert still_open == HALF_OPEN  # answered while they wait, not once the server gave up on them
        server.unharmed()
