"""HTTP/3 for the Python driver: one QUIC connection through aioquic, with its H3 connection."""

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent

from labrunner.run.drive.connection import CONNECT_TIMEOUT_S, HTTP3, Pending, Reply, request_headers


class _H3Protocol(QuicConnectionProtocol):
    """aioquic's QUIC connection with an H3 connection over it, completing each request's future when
    its stream ends (aioquic's own examples/http3_client.py, reduced to GET)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.pending: dict[int, Pending] = {}

    async def wait_connected(self) -> None:
        """aioquic's, whose waiter it shields: a handshake given up on (the connect timeout) leaves the
        waiter to be failed by the close that follows, and asyncio then logs "Future exception was never
        retrieved". That outcome is read here, as the timeout already says what happened."""
        try:
            await super().wait_connected()
        except asyncio.CancelledError:
            if (waiter := self._connected_waiter) is not None:
                waiter.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise

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
        request = Pending(asyncio.get_running_loop().create_future())
        protocol.pending[stream_id] = request
        protocol.h3.send_headers(stream_id, request_headers(self._authority, path), end_stream=True)
        protocol.transmit()
        await request.done
        return Reply(request.status, b"".join(request.body), request.header_bytes, HTTP3)

    async def close(self) -> None:
        await self._connected.aclose()
