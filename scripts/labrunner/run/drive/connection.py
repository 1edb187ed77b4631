"""What every connection of the Python driver shares: the protocols it speaks (as k6 reports them), a
reply, the connection's interface, and the TLS and request headers HTTP/2 and HTTP/3 both use. The
clients are in http1.py, http2.py and http3.py; clients.py opens the one a run drives."""

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from labrunner.model.terms import REST_PROTO

# What k6 reports as res.proto (EXPECT_PROTO), as the matrix's targets expect it.
HTTP1, HTTP2, HTTP3 = REST_PROTO["http1.1"], REST_PROTO["http2"], REST_PROTO["http3"]
PROTOCOLS = (HTTP1, HTTP2, HTTP3)
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Reply:
    """What one request got back: the status, the body, the response headers' bytes and the protocol."""

    status: int
    body: bytes
    header_bytes: int
    protocol: str


class Connection(Protocol):
    """One client connection: requests one at a time, then closed."""

    async def get(self, path: str) -> Reply: ...

    async def close(self) -> None: ...


Opener = Callable[[], Awaitable[Connection]]


def tls_context(ca_file: Path | None, alpn: str) -> ssl.SSLContext:
    """The client's TLS offering one protocol by ALPN: the lab CA (or the system's), certificates verified."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.set_alpn_protocols([alpn])
    return context


@dataclass
class Pending:
    """A request in flight on an HTTP/2 or HTTP/3 connection: what has arrived of its reply."""

    done: "asyncio.Future[None]"
    status: int = 0
    header_bytes: int = 0
    body: list[bytes] = field(default_factory=list)


def request_headers(authority: bytes, path: str) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":authority", authority),
        (b":path", path.encode()),
    ]
