"""Hypercorn's HTTP/3 held to a connection budget and kept from answering what it must not (issue 41),
for the lab's Quart server with HTTP3=1.

- At most MAX_QUIC_CONNECTIONS connections a worker. Hypercorn 0.18's QuicProtocol opens an aioquic
  connection for every Initial packet of 1,200 bytes or more to a connection ID it does not know,
  before anything in it is decrypted, and keeps it, in a dict without a cap, until aioquic's idle
  timeout (60 s) ends it. A forged Initial costs its sender nothing (a 26-byte header on random
  bytes, from any address) and the worker ~65 KiB (a real ClientHello ~100 KiB, and a handshake's
  CPU): at the small profile's 0.5 CPU it opened 300-500 a second, and 40,000 forged ones in 20 s
  took it past its 512 MiB (the kernel killed it; docs/guarantees.md).
  An Initial that would open one more evicts the oldest connection still in its handshake,
  silently, as a SYN cache drops a half-open TCP connection: nothing is sent to an address that may
  be forged, and a real client's next packet opens a new one. A flood has to open
  MAX_QUIC_CONNECTIONS connections while a client's handshake takes its round trips to evict it.
  When every connection held has completed its handshake, the Initial is dropped, as UDP may; those
  end as any other, by their client or at aioquic's idle timeout. None established is evicted.
- No Version Negotiation packet in answer to one, nor to a datagram under 1,200 bytes (RFC 9000,
  sections 6.1 and 5.2.2). Hypercorn answered every long-header packet of a version it does not
  serve, a Version Negotiation packet (version 0) too: one such packet forged from the server's own
  address had it answer itself forever, at its whole CPU quota; from another QUIC server's, the two
  would answer each other.
- A queue of DATAGRAM_QUEUE datagrams between the UDP socket and the QUIC connections, not
  Hypercorn's 10 (hypercorn/asyncio/udp_server.py drops a datagram that finds them queued). Under a
  CPU quota the worker is stopped for most of each CFS period, and 10 VUs' requests and
  acknowledgements queue past 10 datagrams at once: the dropped ones left QUIC's loss recovery to
  wait out its probe timeouts. On a 2-vCPU AMD EPYC VM (2026-12-06, quart-h3 at the quarter profile,
  10 VUs, 100 records, two 5 s repeats each) the 10-datagram queue gave 89-110 req/s at a p99 of
  about 1 s with the service at 63-99% of its quota; 1,024 gave 129-133 req/s, p99 138-143 ms,
  service at 102%. 1,024 datagrams hold at most ~1.5 MiB.

MAX_QUIC_CONNECTIONS = 1,000: five times the most VUs a lab scenario runs (200), each on its own
connection; at ~100 KiB a connection (a real handshake's, or an established one's that has served a
request) a full table is ~100 MiB, and evicted ones wait for Python's cycle collector: under a flood
the worker peaked at 175-210 MiB, from ~70 MiB, of the small profile's 512 MiB.

Hypercorn has no setting for any of these: its QuicProtocol is replaced by a subclass, in the module
its UDP server imports it from when it starts serving (hypercorn.asyncio.udp_server.UDPServer.run),
and its UDPServer by one with the deeper queue, in the module that creates it for each QUIC socket
(hypercorn.asyncio.run), in each process that serves (install(), as services/common/hypercorn_limits.py
does for TCP).
"""

import asyncio
import logging
import time
from typing import Any

import hypercorn.asyncio.run
import hypercorn.protocol.quic
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from aioquic._buffer
from aioquic.quic.packet import PACKET_TYPE_INITIAL, QuicHeader, QuicProtocolVersion, pull_quic_header
from hypercorn.asyncio.udp_server import UDPServer
from hypercorn.events import Event, RawData
from hypercorn.protocol.quic import QuicProtocol, _Connection

MAX_QUIC_CONNECTIONS = 1_000
DATAGRAM_QUEUE = 1_024
LOG_EVERY_SECONDS = 5.0
# What Hypercorn's QuicProtocol.handle asks of a datagram before it opens a connection for it.
_HOST_CID_LENGTH = 8
_MIN_INITIAL_BYTES = 1200
_LONG_HEADER = 0x80
__all__ = ["DATAGRAM_QUEUE", "MAX_QUIC_CONNECTIONS", "install"]

log = logging.getLogger("protolab.quic")


class _CappedQuicProtocol(QuicProtocol):
    """Hypercorn's QuicProtocol, holding at most MAX_QUIC_CONNECTIONS connections (the module's rules)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # By id(): Hypercorn's _Connection compares by value (a dataclass), so it cannot be a key.
        # Insertion order is the order connections were opened: the first handshake is the oldest.
        self._handshaking: dict[int, _Connection] = {}
        self._established: dict[int, _Connection] = {}
        self._evicted = 0
        self._refused = 0
        self._logged_at = float("-inf")

    @property
    def held(self) -> int:
        """The connections this worker holds, in their handshake or past it."""
        return len(self._handshaking) + len(self._established)

    async def handle(self, event: Event) -> None:
        header = _long_header(event)
        opening: bytes | None = None
        if header is not None and isinstance(event, RawData):
            if header.version not in self.quic_config.supported_versions and (
                header.version == QuicProtocolVersion.NEGOTIATION or len(event.data) < _MIN_INITIAL_BYTES
            ):
                return  # not answered: RFC 9000 sections 6.1 and 5.2.2 (the module's rules)
            if self._opens_connection(header, event.data):
                opening = header.destination_cid
                if not await self._make_room():
                    return
        await super().handle(event)
        if opening is not None and (connection := self.connections.get(opening)) is not None:
            self._handshaking[id(connection)] = connection

    def _opens_connection(self, header: QuicHeader, data: bytes) -> bool:
        """Whether Hypercorn's QuicProtocol.handle would open a connection for the datagram (its test)."""
        return (
            header.version in self.quic_config.supported_versions
            and header.packet_type == PACKET_TYPE_INITIAL
            and len(data) >= _MIN_INITIAL_BYTES
            and header.destination_cid not in self.connections
            and not self.context.terminated.is_set()
        )

    async def _make_room(self) -> bool:
        """Whether a new connection may open, having evicted the oldest handshake if the table is full."""
        if self.held < MAX_QUIC_CONNECTIONS:
            return True
        if self._handshaking:
            oldest = next(iter(self._handshaking.values()))
            await self._evict(oldest)
            self._evicted += 1
        else:
            self._refused += 1
        self._note_full()
        return self.held < MAX_QUIC_CONNECTIONS

    async def _evict(self, connection: _Connection) -> None:
        """Forget a connection as Hypercorn does when aioquic ends one, sending nothing."""
        self._handshaking.pop(id(connection), None)
        for cid in connection.cids:
            self.connections.pop(cid, None)
        connection.cids = set()
        await connection.task.stop()

    async def _handle_events(self, connection: _Connection, client: tuple[str, int] | None = None) -> None:
        try:
            await super()._handle_events(connection, client)
        finally:
            key = id(connection)
            if not connection.cids:  # ended: Hypercorn has forgotten its connection IDs
                self._handshaking.pop(key, None)
                self._established.pop(key, None)
            elif key in self._handshaking and connection.quic._handshake_complete:
                self._established[key] = self._handshaking.pop(key)

    def _note_full(self) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            self._logged_at = now
            # Counted in Hypercorn's own table (a connection under each of its IDs), not in this class's.
            held = len({id(connection) for connection in self.connections.values()})
            log.warning(
                "QUIC connections at their cap: %d held (%d in their handshake, cap %d); "
                "%d handshakes evicted, %d Initial packets dropped so far",
                held, len(self._handshaking), MAX_QUIC_CONNECTIONS, self._evicted, self._refused,
            )  # fmt: skip


class _DeepQueueUDPServer(UDPServer):
    """Hypercorn's UDP server, queueing up to DATAGRAM_QUEUE datagrams instead of 10 (the module's rules)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocol_queue = asyncio.Queue(DATAGRAM_QUEUE)


def _long_header(event: Event) -> QuicHeader | None:
    """A datagram's first packet header if it is a long one (a handshake's, a version negotiation's or
    garbage's), else None: short-header packets, as every one past the handshake, are not read here."""
    if not isinstance(event, RawData) or not event.data or not event.data[0] & _LONG_HEADER:
        return None
    try:
        return pull_quic_header(Buffer(data=event.data), host_cid_length=_HOST_CID_LENGTH)
    except ValueError:
        return None


def install() -> None:
    """Serve HTTP/3 in this process with the capped protocol and the deeper queue (before Hypercorn's UDP
    server starts)."""
    hypercorn.protocol.quic.QuicProtocol = _CappedQuicProtocol  # type: ignore[misc]
    hypercorn.asyncio.run.UDPServer = _DeepQueueUDPServer  # type: ignore[attr-defined]  # not re-exported
