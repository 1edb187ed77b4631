"""Oversized headers and slow or half-open connections against every server, one worker each:
an oversized request is a 4xx and the server answers on, and clients that send part of a request (or
of a TLS handshake, or of the HTTP/2 preface) and stop do not stall anyone else: another client is
answered while they still wait, not once the server gave up on them. No figure of time is asserted
(CONTRIBUTING.md): the order of what happened is, and HUNG_AFTER_S only ends a hung test.
"""

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.support import CERTS, RunningService, launch_service, tls_env

HALF_OPEN = 50  # connections held open, each with part of a request
# A bound on any one answer that only ends a hung test: far past an ordinary answer (milliseconds).
# A server that answered only after dropping the slow clients fails on the held connections (they
# are closed by then), not on this bound.
HUNG_AFTER_S = 30.0
BIG_HEADER = "a" * 64 * 1024
# Kinds of server: module, TLS, extra env. One worker each: nothing else can pick up the slack.
KINDS: dict[str, tuple[str, bool, dict[str, str]]] = {
    "aiohttp": ("rest_aiohttp", False, {}),
    "aiohttp-tls": ("rest_aiohttp", True, {}),
    "quart": ("rest_quart", False, {}),
    "quart-h2-tls": ("rest_quart", True, {"ALPN_PROTOCOLS": "h2"}),
    "grpc": ("grpc_aio", False, {}),
    "grpc-tls": ("grpc_aio", True, {}),
}
REST = [name for name, (module, _, _) in KINDS.items() if module.startswith("rest_")]
GRPC = [name for name, (module, _, _) in KINDS.items() if module == "grpc_aio"]
# What a slow client sends before it stops: half a request line, headers without their end,
# the first bytes of a TLS ClientHello (the record header claims 512 bytes), half the HTTP/2
# client preface.
PARTIAL_REQUEST_LINE = b"GET /records?cou"
PARTIAL_HEADERS = b"GET /records?count=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
PARTIAL_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM"

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningService]]:
    """Every kind, started in parallel; each must survive the module and stop with exit code 0."""
    with ThreadPoolExecutor(len(KINDS)) as executor:
        launches = {
            name: executor.submit(launch_service, module, {**(tls_env() if tls else {}), **env})
            for name, (module, tls, env) in KINDS.items()
        }
    started = {name: launch.result() for name, launch in launches.items() if launch.exception() is None}
    failed = [launch.exception() for launch in launches.values() if launch.exception() is not None]
    if failed:
        for service in started.values():
            service.kill()
        raise failed[0]
    yield started
    alive = {name: service.process.poll() is None for name, service in started.items()}
    codes = {name: service.stop() for name, service in started.items()}
    assert all(alive.values()), alive
    assert set(codes.values()) == {0}, codes


def rest_client(service: RunningService) -> httpx.Client:
    """A fresh client (its own connection), trusting the lab CA; HTTP/2 when the server offers it."""
    scheme = "https" if service.tls else "http"
    verify = ssl.create_default_context(cafile=CERTS / "ca.pem")
    return httpx.Client(
        base_url=f"{scheme}://127.0.0.1:{service.port}", verify=verify, http2=True, trust_env=False
    )


def grpc_channel(service: RunningService) -> grpc.Channel:
    address = f"127.0.0.1:{service.port}"
    if service.tls:
        credentials = grpc.ssl_channel_credentials(root_certificates=(CERTS / "ca.pem").read_bytes())
        return grpc.secure_channel(address, credentials)
    return grpc.insecure_channel(address)


def rest_answers(service: RunningService) -> None:
    with rest_client(service) as http:
        response = http.get("/records", params={"count": 5}, timeout=HUNG_AFTER_S)
    assert response.status_code == 200
    assert len(response.json()["records"]) == 5


def grpc_answers(service: RunningService) -> None:
    with grpc_channel(service) as channel:
        stub = cars_pb2_grpc.RecordServiceStub(channel)
        response = stub.ListRecords(cars_pb2.ListRecordsRequest(count=5), timeout=HUNG_AFTER_S)
    assert len(response.records) == 5


@contextlib.contextmanager
def held_connections(port: int, first_bytes: bytes, count: int = HALF_OPEN) -> Iterator[list[socket.socket]]:
    """count connections that send first_bytes and then nothing, open until the block ends."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(first_bytes)
            sockets.append(sock)
        time.sleep(0.2)  # the server has read what they sent and waits for the rest
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def still_open(sockets: list[socket.socket]) -> int:
    """How many held connections the server has not closed (gRPC's server preface is no close)."""
    open_count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            while sock.recv(65536):  # read what the server sent, up to EOF or "nothing more"
                pass
        except BlockingIOError:
            open_count += 1  # nothing more to read and no EOF: the server still waits for the rest
        except OSError:
            pass  # reset
    return open_count


def partial_for(name: str) -> list[bytes]:
    """What slow clients of this kind of server can send: the plaintext part needs no TLS."""
    module, tls, _ = KINDS[name]
    if tls:
        return [PARTIAL_CLIENT_HELLO]
    if module == "grpc_aio":
        return [PARTIAL_H2_PREFACE]
    return [PARTIAL_REQUEST_LINE, PARTIAL_HEADERS]


@pytest.mark.parametrize("name", list(KINDS))
def test_half_open_connections_do_not_stall_other_clients(
    servers: dict[str, RunningService], name: str
) -> None:
    service = servers[name]
    answer = grpc_answers if name in GRPC else rest_answers
    for first_bytes in partial_for(name):
        with held_connections(service.port, first_bytes) as held:
            for _ in range(3):
                answer(service)  # each on a new connection, answered in full (5 records)
            # The slow clients still wait: the answers did not come from dropping them.
            assert still_open(held) == HALF_OPEN, first_bytes


@pytest.mark.parametrize("name", [n for n in REST if not KINDS[n][1]])
def test_a_client_trickling_its_headers_does_not_stall_others(
    servers: dict[str, RunningService], name: str
) -> None:
    service = servers[name]
    with held_connections(service.port, PARTIAL_HEADERS, count=10) as held:
        for _ in range(5):  # a byte per held connection between answers, as a slowloris client would
            for sock in held:
                sock.sendall(b"a")
            rest_answers(service)
        # Answered between the trickles while every trickling client was still being read.
        assert still_open(held) == len(held)


@pytest.mark.parametrize("name", REST)
def test_an_oversized_header_is_a_4xx_and_the_server_answers_on(
    servers: dict[str, RunningService], name: str
) -> None:
    service = servers[name]
    with rest_client(service) as http:
        if name == "quart-h2-tls":
            # HTTP/2 has no room for a 431 before the header block is decoded: Hypercorn's h2
            # ends the connection with ENHANCE_YOUR_CALM (0xb), as RFC 9113 allows.
            with pytest.raises(httpx.RemoteProtocolError, match="error_code:11"):
                http.get("/records", headers={"x-big": BIG_HEADER}, timeout=HUNG_AFTER_S)
        else:
            status = http.get("/records", headers={"x-big": BIG_HEADER}, timeout=HUNG_AFTER_S).status_code
            assert status in {400, 431}, status
    rest_answers(service)


@pytest.mark.parametrize("name", GRPC)
def test_grpc_health_answers_while_half_open_connections_are_held(
    servers: dict[str, RunningService], name: str
) -> None:
    service = servers[name]
    with held_connections(service.port, partial_for(name)[0]) as held, grpc_channel(service) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=HUNG_AFTER_S
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        # Answered while every half-open connection still waited for the rest of its preface.
        assert still_open(held) == HALF_OPEN
