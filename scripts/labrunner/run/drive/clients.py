"""One connection of the Python driver, for each HTTP version: HTTP/1.1 through aiohttp's client,
HTTP/2 through the h2 library, HTTP/3 through aioquic's QUIC and H3 connections. Each connection sends
one request at a time, as a k6 VU does, and answers what a reply was: its status, body and the protocol
that carried it.
"""

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import aiohttp
import h2.config
import h2.connection
import h2.events
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent

from labrunner.model.schema import REST_PROTO

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


def opener(protocol: str, base_url: str, ca_file: Path | None) -> Opener:
    """How to open one connection of `protocol` to base_url ("https://127.0.0.1:8082"); ValueError when
    the pair cannot be (HTTP/3 without TLS, a protocol not in PROTOCOLS)."""
    parts = urlsplit(base_url)
    if protocol not in PROTOCOLS:
        raise ValueError(f"EXPECT_PROTO={protocol}: want one of {', '.join(PROTOCOLS)}")
    if protocol == HTTP1:
        return lambda: Http1Connection.open(base_url, ca_file)
    if parts.scheme != "https" or parts.hostname is None or parts.port is None:
        raise ValueError(f"{protocol} needs an https://host:port address, not {base_url}")
    host, port = parts.hostname, parts.port
    if protocol == HTTP2:
        return lambda: Http2Connection.open(host, port, ca_file)
    return lambda: Http3Connection.open(host, port, ca_file)


def _tls_context(ca_file: Path | None, alpn: str) -> ssl.SSLContext:
    """The client's TLS offering one protocol by ALPN: the lab CA (or the system's), certificates verified."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.set_alpn_protocols([alpn])
    return context


class Http1Connection:
    """HTTP/1.1 on one aiohttp connection (a connector of one); aiohttp's client parser is C."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base_url = base_url

    @classmethod
    async def open(cls, base_url: str, ca_file: Path | None) -> "Http1Connection":
        tls = _tls_context(ca_file, "http/1.1") if base_url.startswith("https") else False
        connector = aiohttp.TCPConnector(limit=1, ssl=tls)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        connection = cls(session, base_url.rstrip("/"))
        # Connected (and TLS done) before the clock starts, as a VU's: aiohttp connects only for a
        # request, so this one, to /healthz, is one more request the server serves for each
        # connection (under CHURN, one a churned connection: docs/http3.md).
        await connection.get("/healthz")
        return connection

    async def get(self, path: str) -> Reply:
        async with self._session.get(self._base_url + path) as response:
            body = await response.read()
            header_bytes = sum(len(k) + len(v) + 4 for k, v in response.raw_headers)
            version = (
                "" if response.version is None else f"HTTP/{response.version.major}.{response.version.minor}"
            )
            return Reply(response.status, body, header_bytes, version)

    async def close(self) -> None:
        await self._session.close()


@dataclass
class _Pending:
    """A request in flight on an HTTP/2 or HTTP/3 connection: what has arrived of its reply."""

    done: "asyncio.Future[None]"
    status: int = 0
    header_bytes: int = 0
    body: list[bytes] = field(default_factory=list)


class _H2Protocol(asyncio.Protocol):
    """The h2 library's connection state over one TLS connection, completing each request's future when
    its stream ends; every byte received is acknowledged at once, so flow control never holds a reply."""

    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.pending: dict[int, _Pending] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports subclass none of asyncio's
        self.h2.initiate_connection()
        self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            request = self.pending.get(getattr(event, "stream_id", -1) or -1)
            if isinstance(event, h2.events.ConnectionTerminated):
                self._fail_all(f"HTTP/2 GOAWAY, error code {event.error_code}")
            elif request is None:
                continue
            elif isinstance(event, h2.events.ResponseReceived):
                request.header_bytes += sum(len(k) + len(v) + 4 for k, v in event.headers)
                request.status = next((int(v) for k, v in event.headers if k == b":status"), 0)
            elif isinstance(event, h2.events.DataReceived):
                request.body.append(event.data)
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                del self.pending[event.stream_id]
                request.done.set_result(None)
            elif isinstance(event, h2.events.StreamReset):
                del self.pending[event.stream_id]
                request.done.set_exception(ConnectionError(f"stream reset, error code {event.error_code}"))
        if self.transport is not None:
            self.transport.write(self.h2.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(f"connection lost: {exc}")

    def _fail_all(self, why: str) -> None:
        for request in self.pending.values():
            if not request.done.done():
                request.done.set_exception(ConnectionError(why))
        self.pending.clear()


class Http2Connection:
    """HTTP/2 on one TLS connection through the h2 library (the state machine Hypercorn's server uses)."""

    def __init__(self, protocol: _H2Protocol, authority: bytes) -> None:
        self._protocol = protocol
        self._authority = authority

    @classmethod
    async def open(cls, host: str, port: int, ca_file: Path | None) -> "Http2Connection":
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(
            _H2Protocol, host, port, ssl=_tls_context(ca_file, "h2"), server_hostname=host
        )
        transport, protocol = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        negotiated = transport.get_extra_info("ssl_object").selected_alpn_protocol()
        if negotiated != "h2":
            transport.close()
            raise ConnectionError(f"TLS to {host}:{port} negotiated ALPN {negotiated!r}, not h2")
        return cls(protocol, f"{host}:{port}".encode())

    async def get(self, path: str) -> Reply:
        protocol = self._protocol
        if protocol.transport is None or protocol.transport.is_closing():
            raise ConnectionError("HTTP/2 connection closed")
        stream_id = protocol.h2.get_next_available_stream_id()
        request = _Pending(asyncio.get_running_loop().create_future())
        protocol.pending[stream_id] = request
        protocol.h2.send_headers(stream_id, _request_headers(self._authority, path), end_stream=True)
        protocol.transport.write(protocol.h2.data_to_send())
        await request.done
        return Reply(request.status, b"".join(request.body), request.header_bytes, HTTP2)

    async def close(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.h2.close_connection()
            self._protocol.transport.write(self._protocol.h2.data_to_send())
            self._protocol.transport.close()


def _request_headers(authority: bytes, path: str) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":authority", authority),
        (b":path", path.encode()),
    ]


class _H3Protocol(QuicConnectionProtocol):
    """aioquic's QUIC connection with an H3 connection over it, completing each request's future when
    its stream ends (aioquic's own examples/http3_client.py, reduced to GET)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.pending: dict[int, _Pending] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            for request in self.pending.values():
                if not request.done.done():
                    request.done.set_exception(
                        ConnectionError(f"QUIC connection closed: {event.reason_phrase}")
                    )
            self.pending.clear()
        for h3_event in self.h3.handle_event(event):
            self._http_event(h3_event)

    def _http_event(self, event: H3Event) -> None:
        request = self.pending.get(getattr(event, "stream_id", -1))
        if request is None:
            return
        if isinstance(event, HeadersReceived):
            request.header_bytes += sum(len(k) + len(v) + 4 for k, v in event.headers)
            request.status = next((int(v) for k, v in event.headers if k == b":status"), request.status)
        elif isinstance(event, DataReceived):
            request.body.append(event.data)
        if getattr(event, "stream_ended", False):
            del self.pending[event.stream_id]  # type: ignore[attr-defined]
            request.done.set_result(None)


class Http3Connection:
    """HTTP/3 on one QUIC connection, whose ALPN must be h3."""

    def __init__(self, protocol: _H3Protocol, authority: bytes, connected: contextlib.AsyncExitStack) -> None:
        self._protocol = protocol
        self._authority = authority
        self._connected = connected  # aioquic's connect(), whose exit closes the connection

    @classmethod
    async def open(cls, host: str, port: int, ca_file: Path | None) -> "Http3Connection":
        configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
        configuration.load_verify_locations(cafile=str(ca_file) if ca_file else None)
        connected = contextlib.AsyncExitStack()
        connecting = connect(host, port, configuration=configuration, create_protocol=_H3Protocol)
        protocol = await asyncio.wait_for(connected.enter_async_context(connecting), CONNECT_TIMEOUT_S)
        assert isinstance(protocol, _H3Protocol)
        negotiated = protocol._quic.tls.alpn_negotiated
        if negotiated not in H3_ALPN:
            await connected.aclose()
            raise ConnectionError(f"QUIC to {host}:{port} negotiated ALPN {negotiated!r}, not h3")
        return cls(protocol, f"{host}:{port}".encode(), connected)

    async def get(self, path: str) -> Reply:
        protocol = self._protocol
        stream_id = protocol._quic.get_next_available_stream_id()
        request = _Pending(asyncio.get_running_loop().create_future())
        protocol.pending[stream_id] = request
        protocol.h3.send_headers(stream_id, _request_headers(self._authority, path), end_stream=True)
        protocol.transmit()
        await request.done
        return Reply(request.status, b"".join(request.body), request.header_bytes, HTTP3)

    async def close(self) -> None:
        await self._connected.aclose()
