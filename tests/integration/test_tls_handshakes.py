"""The TLS handshakes the servers count (protolab_tls_handshakes_total{resumed}), against what a client
saw: the real servers whose TLS is Python's ssl module (aiohttp and grpclib on uvloop, Quart on
Hypercorn's uvloop workers), a sync ssl client making full handshakes, then resumed ones from the
previous connection's session; and no series where nothing is counted (cleartext, Granian, grpc.aio)."""

import socket
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics import FLUSH_SECONDS
from tests.support import CERTS, RunningService, tls_env

# Sockets on ephemeral ports, its own processes, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(90), pytest.mark.parallel]

COUNTING = ("rest_aiohttp", "rest_quart", "grpc_grpclib")
FULL, RESUMED = 3, 4
METRIC = "protolab_tls_handshakes"
# What a connection carries, by the protocol the server speaks: one HTTP/1.1 request closed by the
# server, or HTTP/2's preface and the server's first frame (grpclib speaks HTTP/2 only).
HTTP11_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + SETTINGS


def client_context(module: str, tls12: bool = False) -> ssl.SSLContext:
    tls_env()  # generates certs/ when missing
    context = ssl.create_default_context(cafile=CERTS / "ca.pem")
    context.set_alpn_protocols(["h2"] if module == "grpc_grpclib" else ["http/1.1"])
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


class Seen(NamedTuple):
    """What the client saw of a connection."""

    reused: bool
    session: ssl.SSLSession
    version: str | None


def connect(
    service: RunningService, module: str, client: ssl.SSLContext, session: ssl.SSLSession | None
) -> Seen:
    """One connection, offering session, through one exchange: then the client holds the server's
    session tickets (they follow the handshake), and the server has counted its handshake (completed
    before it answers)."""
    raw = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    with client.wrap_socket(raw, server_hostname="localhost", session=session) as sock:
        if module == "grpc_grpclib":
            sock.sendall(HTTP2_PREFACE)
            assert sock.recv(9)  # the server's SETTINGS
        else:
            sock.sendall(HTTP11_REQUEST)
            response = b""
            while chunk := sock.recv(65536):
                response += chunk
            assert response.startswith(b"HTTP/1.1 200"), response[:100]
        assert sock.session is not None
        return Seen(sock.session_reused is True, sock.session, sock.version())


def handshakes(service: RunningService) -> dict[str, float] | None:
    """The resumed label's value -> protolab_tls_handshakes_total; None when the series are absent."""
    text = httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", trust_env=False, timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == METRIC:
            return {sample.labels["resumed"]: sample.value for sample in family.samples}
    return None


def settled_handshakes(service: RunningService, full: int, resumed: int) -> dict[str, float] | None:
    """The counts once they equal (full, resumed), or after 10 s; then after two more flushes, so that a
    count past the expected one would show too. Workers write their counts every FLUSH_SECONDS."""
    expected = {"false": full, "true": resumed}
    deadline = time.monotonic() + 10
    while handshakes(service) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2 * FLUSH_SECONDS)
    return handshakes(service)


@pytest.fixture
def start(start_service: Callable[..., RunningService]) -> Callable[..., RunningService]:
    def start_tls(module: str, **env: str) -> RunningService:
        return start_service(module, {**tls_env(), **env})

    return start_tls


@pytest.mark.parametrize("module", COUNTING)
def test_full_and_resumed_handshakes_are_counted_exactly(
    module: str, start: Callable[..., RunningService]
) -> None:
    """One worker (its own ticket keys, so every offered session resumes): FULL full handshakes, then
    RESUMED resumed ones, under TLS 1.3 and then TLS 1.2 (tickets)."""
    service = start(module)
    assert handshakes(service) == {"false": 0, "true": 0}  # both series from the start
    for tls12 in (False, True):
        client = client_context(module, tls12)
        seen = [connect(service, module, client, None) for _ in range(FULL)]
        for _ in range(RESUMED):
            seen.append(connect(service, module, client, seen[-1].session))
        assert [connection.reused for connection in seen] == [False] * FULL + [True] * RESUMED
        assert {connection.version for connection in seen} == {"TLSv1.2" if tls12 else "TLSv1.3"}
    assert settled_handshakes(service, 2 * FULL, 2 * RESUMED) == {"false": 2 * FULL, "true": 2 * RESUMED}
    assert service.stop() == 0


@pytest.mark.parametrize("module", COUNTING)
def test_two_workers_count_what_the_client_saw(module: str, start: Callable[..., RunningService]) -> None:
    """Each worker's context seals its tickets with its own keys, so a session resumes only on the
    worker that issued it; the kernel picks the worker. The workers' counts, merged, equal the
    client's: each connection counted once, as full or resumed as the client saw it."""
    service = start(module, WORKERS="2")
    client = client_context(module)
    seen = [connect(service, module, client, None)]
    for _ in range(19):
        seen.append(connect(service, module, client, seen[-1].session))
    reused = [connection.reused for connection in seen]
    full, resumed = reused.count(False), reused.count(True)
    assert settled_handshakes(service, full, resumed) == {"false": full, "true": resumed}
    assert service.stop() == 0


@pytest.mark.parametrize(
    ("module", "tls"),
    [*((module, False) for module in COUNTING), ("rest_granian", True), ("grpc_aio", True)],
    ids=lambda value: {False: "cleartext", True: "tls"}.get(value, value),
)
def test_no_series_where_nothing_is_counted(
    module: str, tls: bool, start_service: Callable[..., RunningService]
) -> None:
    """A cleartext server makes no handshakes, and Granian's (rustls) and grpc.aio's (gRPC core) TLS
    cannot be counted from Python: no series, rather than zeros that would read as counted."""
    service = start_service(module, tls_env() if tls else {})
    assert service.tls is tls
    assert handshakes(service) is None
    assert service.stop() == 0
