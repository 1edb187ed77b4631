"""grpclib's receive of one message, replaced (grpclib 0.4.9, pinned) so that what a client sends ends in
a named status, never UNKNOWN with a traceback, and no declared length is read past the bound (issue 37).

grpclib's own recv_message reads a message of any declared length (up to 4 GiB) before its codec can
look at it, asserts when the stream ends inside a message and raises NotImplementedError for the
compressed flag; the server answers both with UNKNOWN and logs a traceback. Here: the compressed flag
is UNIMPLEMENTED (no grpc-encoding is offered), another flag or a stream that ends inside a message
INVALID_ARGUMENT, a declared length over the codec's max_request_bytes RESOURCE_EXHAUSTED before its
bytes are read, and a call that set a counter (count_received) has each length counted before the
message is read, so an upload's total is refused before it is held.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import grpclib.server
from grpclib.const import Status
from grpclib.exceptions import GRPCError

_PREFIX_BYTES = 5  # the compressed flag and a 4-byte big-endian length
_RECEIVED: ContextVar[Callable[[int], None] | None] = ContextVar("received", default=None)


class _Data(Protocol):
    async def recv_data(self, size: int) -> bytes: ...


class BoundedCodec(Protocol):
    max_request_bytes: int

    def decode(self, data: bytes, message_type: Any) -> Any: ...


@contextmanager
def count_received(counter: Callable[[int], None]) -> Iterator[None]:
    """Within the block (one call's task), every message's declared length goes to counter before the
    message is read; counter raises to refuse it."""
    token = _RECEIVED.set(counter)
    try:
        yield
    finally:
        _RECEIVED.reset(token)


async def recv_message(stream: _Data, codec: BoundedCodec, message_type: Any) -> Any:
    """One message of a call, or None at the end of its stream."""
    try:
        prefix = await stream.recv_data(_PREFIX_BYTES)
        if not prefix:
            return None
        flag, length = prefix[0], int.from_bytes(prefix[1:], "big")
        if flag == 1:
            raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not accepted")
        if flag != 0:
            raise GRPCError(Status.INVALID_ARGUMENT, f"message flag {flag} is neither 0 nor 1")
        if length > codec.max_request_bytes:
            message = f"Received message larger than max ({length} vs. {codec.max_request_bytes})"
            raise GRPCError(Status.RESOURCE_EXHAUSTED, message)
        counter = _RECEIVED.get()
        if counter is not None:
            counter(length)
        data = await stream.recv_data(length)
    except AssertionError:  # grpclib's Buffer.read: the stream ended before the bytes it was asked for
        raise GRPCError(Status.INVALID_ARGUMENT, "the request stream ended inside a message") from None
    return codec.decode(data, message_type)


def install() -> None:
    """Make grpclib's server streams receive with recv_message (its module imports the function by name)."""
    grpclib.server.recv_message = recv_message  # type: ignore[attr-defined,assignment]
