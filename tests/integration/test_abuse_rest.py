"""The abuse suite's REST cases, on every REST server and floor, each in its cgroup at the small profile's
limits: an upload under Content-Encoding gzip that is not gzip, a valid gzip bomb, a client that leaves
mid-body, a body trickled slowly, 5,000 idle connections, and cleartext HTTP/2 (prior knowledge, an h2c
upgrade). Each answer is a 4xx (or the connection closed, for a client that is gone), the memory peak
stays under the limit, and the server serves a normal request afterwards (docs/guarantees.md)."""

import contextlib
import functools
import gzip
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.abuse_support import (
    MEMORY_BYTES,
    REST_MODULES,
    Confined,
    confined,
    ids,
    implementations,
)

IMPLEMENTATIONS = implementations(REST_MODULES)
IDLE_CONNECTIONS = 5000


@functools.cache
def bomb() -> bytes:
    """1 GiB of zeros: a 1 MiB body that would inflate a thousandfold. Built when the test runs, not
    on import: 7-10 s of CPU that every pytest process collecting the suite paid, in both phases."""
    return gzip.compress(b"\0" * 2**30, compresslevel=9)


TRICKLE_BYTES, TRICKLE_EVERY_SECONDS = 10, 0.2

pytestmark = [pytest.mark.timeout(180), pytest.mark.paired]  # servers under CPU quotas, no figure judged


@pytest.fixture(scope="module", params=IMPLEMENTATIONS, ids=ids(IMPLEMENTATIONS))
def server(request: pytest.FixtureRequest) -> Iterator[Confined]:
    package, module = request.param
    with confined(package, module) as started:
        yield started


@pytest.fixture
def abused(server: Confined) -> Iterator[Confined]:
    """The server with its memory peak reset; afterwards alive, under its limit and serving."""
    server.reset_peak()
    yield server
    print(f"\nmemory peak {server.unharmed() / 2**20:.0f} MiB of {MEMORY_BYTES / 2**20:.0f} MiB")
    answer = httpx.get(f"http://127.0.0.1:{server.service.port}/records?count=2", timeout=10, trust_env=False)
    assert answer.status_code == 200 and len(answer.json()["records"]) == 2


def _post(port: int, body: bytes, encoding: str) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    return httpx.post(
        f"http://127.0.0.1:{port}/records", content=body, headers=headers, timeout=30, trust_env=False
    )


@pytest.mark.parametrize("case", ["not gzip", "gzip bomb"], ids=["not-gzip", "gzip-bomb"])
def test_an_encoded_upload_is_415(abused: Confined, case: str) -> None:
    body = bomb() if case == "gzip bomb" else b'{"records": []}'
    answer = _post(abused.service.port, body, "gzip")
    print(f"\n{case}: {answer.status_code} {answer.text}")
    assert answer.status_code == 415
    assert answer.json()["status"] == 415


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_a_client_leaving_mid_body_is_no_server_error(abused: Confined) -> None:
    with _raw(abused.service.port) as sock:
        sock.sendall(
            b"POST /records HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"records": ['
        )
    # The server sees the close; its workers write their counts every 0.5 s: a 5xx series is there by then.
    time.sleep(1.5)
    if abused.service.metrics_port:  # the lab's servers count statuses (the floors have no metrics)
        metrics = httpx.get(f"http://127.0.0.1:{abused.service.metrics_port}/metrics", timeout=10).text
        statuses = set(re.findall(r'http_response_status_code="(\d+)"', metrics))
        print(f"\nstatuses counted: {sorted(statuses)}")
        assert not any(status.startswith("5") for status in statuses), statuses


def test_a_trickled_body_is_answered_and_delays_no_one(abused: Confined) -> None:
    body = b'{"records": []}'
    with _raw(abused.service.port) as sock:
        sock.sendall(
            b"POST /records HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for start in range(0, len(body), TRICKLE_BYTES):
            sock.sendall(body[start : start + TRICKLE_BYTES])
            # Another client meanwhile: served at once, whatever the trickle.
            other = httpx.get(f"http://127.0.0.1:{abused.service.port}/healthz", timeout=10, trust_env=False)
            assert other.status_code == 200
            time.sleep(TRICKLE_EVERY_SECONDS)
        answer = sock.recv(4096)
    print(f"\ntrickled: {answer[:40]!r}")
    assert re.match(rb"HTTP/1\.[01] 400", answer), answer[:80]  # no record: 400 naming it


def test_idle_connections_leave_the_server_serving(abused: Confined) -> None:
    with contextlib.ExitStack() as idle:
        opened = 0
        for _ in range(IDLE_CONNECTIONS):
            try:
                idle.enter_context(_raw(abused.service.port))
                opened += 1
            except OSError:
                break  # the backlog is full: the server is not accepting more
        answer = httpx.get(f"http://127.0.0.1:{abused.service.port}/healthz", timeout=30, trust_env=False)
        print(f"\n{opened} idle connections; /healthz {answer.status_code}")
        assert opened > 0 and answer.status_code == 200


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _whole_http1_response(received: bytes) -> bool:
    """An HTTP/1.x status line, its headers and as much body as their Content-Length says."""
    head, blank_line, body = received.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return (
        received.startswith(b"HTTP/1.")
        and bool(blank_line)
        and length is not None
        and len(body) >= int(length[1])
    )


def _answer_to(port: int, request: bytes) -> bytes:
    """What a cleartext server sends back to request: one whole HTTP/1.x response, or whatever came
    until it closed or 5 s passed (a kept-alive connection is not waited out: 5 s a case)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        received = b""
        try:
            while not _whole_http1_response(received) and (chunk := sock.recv(65536)):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received


def test_cleartext_http2_is_refused(abused: Confined) -> None:
    # Every REST target offers HTTP/1.1 in cleartext (HTTP/2 only by ALPN, under TLS).
    port = abused.service.port
    preface = _answer_to(port, PREFACE)
    upgrade = _answer_to(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    print(f"\npreface -> {preface[:40]!r}; h2c upgrade -> {upgrade[:40]!r}")
    # An HTTP/2 server's first frame is SETTINGS (type 4) after a 3-byte length: never sent here.
    assert not (len(preface) >= 4 and preface[3] == 4 and not preface.startswith(b"HTTP/")), preface[:40]
    assert preface == b"" or re.match(rb"HTTP/1\.[01] 4\d\d", preface), preface[:40]  # closed, or a 4xx
    assert upgrade.startswith(b"HTTP/1.1 200"), upgrade[:40]  # answered over HTTP/1.1, not switched
