"""Response compression (COMPRESSION, services/common/config.py) on the real lab servers: under gzip the
REST servers (aiohttp, Quart on Hypercorn over HTTP/1.1 and over HTTP/2 with TLS, Quart on Granian) send
the /records body gzip-compressed to a client whose Accept-Encoding allows it, and its bytes as they
came off the wire (read without decompressing) gunzip to exactly the identity server's body, in fewer
bytes; a client that does not accept gzip gets the body as it is, and an identity server never
compresses. grpc.aio under gzip answers the same records in fewer bytes on the wire, counted by a relay
in front of it. The listening line says the compression; a name the lab does not know, or gzip on a
server that cannot compress (grpclib), stops the server at start with a configuration error naming
COMPRESSION."""

import contextlib
import functools
import gzip
import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import NamedTuple

import grpc
import httpx
import pytest

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.e2e.k6_servers import CountingRelay
from tests.support import CERTS, ROOT, RunningService, launch_at_once, launch_service, tls_env

# Sockets on ephemeral ports, its own processes; bytes counted, no CPU or time measured: beside other
# tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(90), pytest.mark.parallel]

# An explicit offset: without one each server rotates through its pool from request to request, and
# the bodies compared must hold the same records. The default pool (RECORD_SEED, RECORD_POOL_SIZE) is
# every server's here.
COUNT = 100
QUERY = f"/records?count={COUNT}&offset=0"
GZIP_MAGIC = b"\x1f\x8b"
# The gRPC calls counted through the relay: protobuf cars at 100 records compress about 2x.
CALLS = 20


class Server(NamedTuple):
    module: str
    compression: str  # COMPRESSION as the server is given it ("": unset, so identity)
    tls: bool = False


# The servers the module shares; each REST server under gzip beside its identity twin.
SERVERS = {
    "aiohttp": Server("rest_aiohttp", "gzip"),
    "aiohttp-identity": Server("rest_aiohttp", "identity"),
    "quart": Server("rest_quart", "gzip"),
    "quart-identity": Server("rest_quart", "identity"),
    "quart-h2-tls": Server("rest_quart", "gzip", tls=True),
    "granian": Server("rest_granian", "gzip"),
    "granian-identity": Server("rest_granian", "identity"),
    "grpc": Server("grpc_aio", "gzip"),
    "grpc-identity": Server("grpc_aio", ""),
}
# What the listening line must say of each.
SAID = {name: server.compression or "identity" for name, server in SERVERS.items()}
GZIP_REST = ["aiohttp", "quart", "quart-h2-tls", "granian"]
IDENTITY_REST = ["aiohttp-identity", "quart-identity", "granian-identity"]
# The identity server whose body each REST server's must equal (Quart's app for both its transports).
TWIN = {
    "aiohttp": "aiohttp-identity",
    "quart": "quart-identity",
    "quart-h2-tls": "quart-identity",
    "granian": "granian-identity",
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningService]]:
    """Every server of SERVERS, started at once; killed at the end (their stop is not under test)."""

    def launch(server: Server) -> RunningService:
        return launch_service(
            server.module, {"COMPRESSION": server.compression, **(tls_env() if server.tls else {})}
        )

    tls_env()  # generates certs/ when missing, once, before the launches
    started = launch_at_once({name: functools.partial(launch, server) for name, server in SERVERS.items()})
    try:
        yield started
    finally:
        for service in started.values():
            service.kill()


class Answer(NamedTuple):
    """A /records response as it came: its headers and its body's bytes, not decompressed."""

    status: int
    http_version: str
    content_encoding: str | None
    vary: str | None
    raw: bytes


def get_h1(service: RunningService, accept_encoding: str | None) -> Answer:
    """GET QUERY over HTTP/1.1 (http.client, which never decompresses); accept_encoding None: no
    Accept-Encoding header at all."""
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        connection.putrequest("GET", QUERY, skip_accept_encoding=True)
        if accept_encoding is not None:
            connection.putheader("Accept-Encoding", accept_encoding)
        connection.endheaders()
        response = connection.getresponse()
        raw = response.read()
        return Answer(
            response.status,
            "HTTP/1.1",
            response.getheader("Content-Encoding"),
            response.getheader("Vary"),
            raw,
        )
    finally:
        connection.close()


def get_h2(service: RunningService, accept_encoding: str | None) -> Answer:
    """GET QUERY over HTTP/2 with TLS (httpx with h2, ALPN offering h2 only); the body read raw, as it
    came, without httpx's decoding."""
    context = ssl.create_default_context(cafile=CERTS / "ca.pem")
    context.set_alpn_protocols(["h2"])
    with httpx.Client(verify=context, http2=True, trust_env=False, timeout=10) as client:
        request = client.build_request("GET", f"https://localhost:{service.port}{QUERY}")
        del request.headers["Accept-Encoding"]  # httpx's own default
        if accept_encoding is not None:
            request.headers["Accept-Encoding"] = accept_encoding
        response = client.send(request, stream=True)
        try:
            raw = b"".join(response.iter_raw())
        finally:
            response.close()
    return Answer(
        response.status_code,
        response.http_version,
        response.headers.get("Content-Encoding"),
        response.headers.get("Vary"),
        raw,
    )


def get(servers: dict[str, RunningService], name: str, accept_encoding: str | None) -> Answer:
    service = servers[name]
    answer = (get_h2 if SERVERS[name].tls else get_h1)(service, accept_encoding)
    assert answer.status == 200, (name, answer)
    assert answer.http_version == ("HTTP/2" if SERVERS[name].tls else "HTTP/1.1"), (name, answer.http_version)
    return answer


def identity_body(servers: dict[str, RunningService], name: str) -> bytes:
    """The body name's identity twin sends for QUERY: JSON, as it is."""
    answer = get(servers, TWIN[name], None)
    assert answer.content_encoding is None and answer.raw.startswith(b"{"), answer
    return answer.raw


def test_the_listening_line_says_the_compression(servers: dict[str, RunningService]) -> None:
    assert {name: service.listening.get("compression") for name, service in servers.items()} == SAID


@pytest.mark.parametrize("accept_encoding", ["gzip", "gzip, deflate, br", "br;q=1.0, gzip;q=0.5", "*"])
@pytest.mark.parametrize("name", GZIP_REST)
def test_a_gzip_server_sends_the_identity_body_gzipped_when_gzip_is_accepted(
    servers: dict[str, RunningService], name: str, accept_encoding: str
) -> None:
    answer = get(servers, name, accept_encoding)
    plain = identity_body(servers, name)
    assert answer.content_encoding == "gzip", answer
    assert answer.vary is not None and "accept-encoding" in answer.vary.lower(), answer.vary
    assert answer.raw.startswith(GZIP_MAGIC), answer.raw[:16]
    assert gzip.decompress(answer.raw) == plain
    assert len(answer.raw) < len(plain), (len(answer.raw), len(plain))


# A gzip refused at q=0 is refused whatever "*" says, before it or after (RFC 9110 12.5.3: "*" matches
# the codings not listed).
NOT_ACCEPTED = [
    None,
    "gzip;q=0",
    "identity",
    "br",
    "gzip;q=0, br",
    "gzip;q=0, *",
    "*, gzip;q=0",
]


@pytest.mark.parametrize("accept_encoding", NOT_ACCEPTED)
@pytest.mark.parametrize("name", GZIP_REST)
def test_a_gzip_server_sends_the_body_as_it_is_when_gzip_is_not_accepted(
    servers: dict[str, RunningService], name: str, accept_encoding: str | None
) -> None:
    answer = get(servers, name, accept_encoding)
    assert answer.content_encoding is None, answer.content_encoding
    # The answer still varies with Accept-Encoding: a cache must not hand it to a client that accepts gzip.
    assert answer.vary is not None and "accept-encoding" in answer.vary.lower(), answer.vary
    assert answer.raw == identity_body(servers, name)


@pytest.mark.parametrize("accept_encoding", ["gzip", "gzip, deflate, br", "*", None])
@pytest.mark.parametrize("name", IDENTITY_REST)
def test_an_identity_server_never_compresses(
    servers: dict[str, RunningService], name: str, accept_encoding: str | None
) -> None:
    answer = get(servers, name, accept_encoding)
    assert answer.content_encoding is None, answer.content_encoding
    assert answer.raw.startswith(b"{") and b'"records"' in answer.raw, answer.raw[:64]
    assert answer.raw == get(servers, name, None).raw


@pytest.mark.parametrize(
    ("module", "compression", "refusal"),
    [
        *(
            (module, "br", "COMPRESSION='br' must be one of identity, gzip")
            for module in ("rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio")
        ),
        ("grpc_grpclib", "gzip", "COMPRESSION=gzip: grpc_grpclib cannot compress its responses"),
    ],
)
def test_a_compression_the_server_cannot_give_stops_it_at_start(
    module: str, compression: str, refusal: str
) -> None:
    env = {**os.environ, "PORT": "0", "METRICS_PORT": "0", "WORKERS": "1", "COMPRESSION": compression}
    process = subprocess.Popen(
        [sys.executable, "-m", f"services.{module}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a server that started after all is ended whole
    )
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    # One clear line, no traceback, and never a listening line.
    assert result.stderr == f"configuration error: {refusal}\n", result.stderr
    assert '"listening"' not in result.stdout, result.stdout


class Counted(NamedTuple):
    replies: list[cars_pb2.ListRecordsResponse]
    server_bytes: int  # what the server sent, every byte of the connection's life
    client_bytes: int


def list_through_relay(service: RunningService) -> Counted:
    """CALLS ListRecords(count=COUNT, offset=0) on one connection through a CountingRelay; its bytes once
    the connection has ended both ways (the client closed it, the server's end read to EOF)."""
    with CountingRelay(service.port) as relay:
        with grpc.insecure_channel(f"127.0.0.1:{relay.port}") as channel:
            stub = cars_pb2_grpc.RecordServiceStub(channel)
            request = cars_pb2.ListRecordsRequest(count=COUNT, offset=0)
            replies = [stub.ListRecords(request, timeout=10) for _ in range(CALLS)]
        deadline = time.monotonic() + 10  # only ends a hung test
        while relay.ended < 2 * relay.accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert relay.accepted == 1 and relay.ended == 2, (relay.accepted, relay.ended)
        return Counted(replies, relay.server_bytes, relay.client_bytes)


def test_grpc_aio_under_gzip_answers_the_same_records_in_fewer_bytes(
    servers: dict[str, RunningService],
) -> None:
    plain = list_through_relay(servers["grpc-identity"])
    packed = list_through_relay(servers["grpc"])
    assert len(plain.replies[0].records) == COUNT
    assert all(reply == plain.replies[0] for reply in plain.replies + packed.replies)
    # What the server sent: 20 replies of about 7.5 kB as they are, about 3.9 kB gzipped.
    assert packed.server_bytes < 0.75 * plain.server_bytes, (packed.server_bytes, plain.server_bytes)
    assert plain.server_bytes > CALLS * plain.replies[0].ByteSize(), plain.server_bytes
