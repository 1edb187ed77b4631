"""HTTP/2 for the Python driver: one TLS connection through the h2 library."""

import asyncio
from pathlib import Path
from typing import cast

import h2.config
import h2.connection
import h2.events

from labrunner.run.drive.connection import (
    CONNECT_TIMEOUT_S,
    HTTP2,
    Pending,
    Reply,
    request_headers,
    tls_context,
)


class _H2Protocol(asyncio.Protocol):
    """The h2 library's connection state over one TLS connection, completing each request's future when
    its stream ends; every byte received is acknowledged at once, so flow control never holds a reply."""

    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.pending: dict[int, Pending] = {}
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
            _H2Protocol, host, port, ssl=tls_context(ca_file, "h2"), server_hostname=host
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
        request = Pending(asyncio.get_running_loop().create_future())
        protocol.pending[stream_id] = request
        protocol.h2.send_headers(stream_id, request_headers(self._authority, path), end_stream=True)
        protocol.transport.write(protocol.h2.data_to_send())
        await request.done
        return Reply(request.status, b"".join(request.body), request.header_bytes, HTTP2)

    async def close(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.h2.close_connection()
            self._protocol.transport.write(self._protocol.h2.data_to_send())
            self._protocol.transport.close()
