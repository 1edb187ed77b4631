"""grpclib floor: RecordService and health on grpclib and uvloop; nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpclib.server
import uvloop
from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.health.service import Health
from grpclib.server import Server, Stream

from benchmarks.floor.common import (
    LISTEN_BACKLOG,
    BadRequest,
    FloorSettings,
    FloorShape,
    Records,
    floor_settings,
    listen_socket,
    run,
)
from benchmarks.floor.messages import Messages, Request, Uploads, UploadTooLarge, undecodable
from benchmarks.floor.shapes import FLOOR_SHAPES
from services.common import grpclib_limits
from services.common.pb import cars_grpc, cars_pb2


class Codec(ProtoCodec):
    """Bytes that do not parse are INVALID_ARGUMENT, as the lab answers; max_request_bytes is the largest
    message _recv_message reads."""

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            return super().decode(data, message_type)
        except DecodeError:
            raise GRPCError(Status.INVALID_ARGUMENT, undecodable(message_type)) from None


# An UploadRecords call's counter of the bytes it has received (its task's), set by its handler.
_RECEIVED: ContextVar[Callable[[int], None] | None] = ContextVar("received", default=None)


async def _recv_message(stream: Any, codec: Codec, message_type: Any) -> Any:
    """grpclib 0.4.9's recv_message with the lab's answers (services/grpc_grpclib/wire.py): the compressed
    flag UNIMPLEMENTED, another flag or a stream ending inside a message INVALID_ARGUMENT, a declared
    length over max_request_bytes, or an upload's total over it, RESOURCE_EXHAUSTED before it is read."""
    try:
        prefix = await stream.recv_data(5)
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
    except AssertionError:  # grpclib's Buffer.read: the stream ended before the bytes asked for
        raise GRPCError(Status.INVALID_ARGUMENT, "the request stream ended inside a message") from None
    return codec.decode(data, message_type)


class RecordService(cars_grpc.RecordServiceBase):
    """RecordService, or the shape's service with its four methods."""

    def __init__(self, messages: Messages, uploads: Uploads, shape: FloorShape) -> None:
        self._messages = messages
        self._uploads = uploads
        self._shape = shape

    def __mapping__(self) -> dict[str, Handler]:
        shape, prefix = self._shape, f"/{self._shape.service}/"
        request, reply = cars_pb2.ListRecordsRequest, cars_pb2.CreateRecordsReply
        return {
            prefix + "ListRecords": Handler(
                self.ListRecords, Cardinality.UNARY_UNARY, request, shape.list_message
            ),
            prefix + "StreamRecords": Handler(
                self.StreamRecords, Cardinality.UNARY_STREAM, request, shape.record_message
            ),
            prefix + "CreateRecords": Handler(
                self.CreateRecords, Cardinality.UNARY_UNARY, shape.create_message, reply
            ),
            prefix + "UploadRecords": Handler(
                self.UploadRecords, Cardinality.STREAM_UNARY, shape.record_message, reply
            ),
        }

    async def _request(self, stream: Stream[Request, Any]) -> Request:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        return request

    async def ListRecords(self, stream: Stream[Request, Any]) -> None:
        request = await self._request(stream)
        try:
            response = self._messages.response(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        await stream.send_message(response)

    async def StreamRecords(self, stream: Stream[Request, Any]) -> None:
        request = await self._request(stream)
        try:
            messages = self._messages.stream(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        for message in messages:
            await stream.send_message(message)

    async def CreateRecords(self, stream: Stream[Any, cars_pb2.CreateRecordsReply]) -> None:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        try:
            reply = self._uploads.create(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        await stream.send_message(reply)

    async def UploadRecords(self, stream: Stream[Any, cars_pb2.CreateRecordsReply]) -> None:
        records: list[Any] = []
        total = 0

        def count(size: int) -> None:
            nonlocal total
            total = self._uploads.counted(total, size)

        token = _RECEIVED.set(count)
        try:
            while (message := await stream.recv_message()) is not None:
                self._uploads.add(records, message)
            reply = self._uploads.reply(records)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        except UploadTooLarge as error:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, str(error)) from None
        finally:
            _RECEIVED.reset(token)
        await stream.send_message(reply)


async def _serve(
    settings: FloorSettings, records: RecordService, port: int, ready: Callable[[int], None]
) -> None:
    # No checks: SERVING for the server ("") and RecordService, what the runner's health wait asks.
    server = Server([records, Health({records: []})], codec=Codec(settings.max_request_bytes))
    sock = listen_socket(settings, port)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await server.start(sock=sock, backlog=LISTEN_BACKLOG)
    ready(sock.getsockname()[1])
    await stopping.wait()
    server.close()
    await server.wait_closed()


def main() -> None:
    settings = floor_settings("floor_grpc_grpclib")
    grpclib_limits.install()
    grpclib.server.recv_message = _recv_message  # type: ignore[attr-defined,assignment]  # by name, as grpclib imports it
    shape = FLOOR_SHAPES[settings.shape]
    records = RecordService(
        Messages(settings, Records(settings, shape.flat), shape),
        Uploads(settings.max_count, settings.max_request_bytes, shape),
        shape,
    )
    run(settings, lambda port, ready: uvloop.run(_serve(settings, records, port, ready)))


if __name__ == "__main__":
    main()
