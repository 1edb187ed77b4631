"""RecordService on grpclib: the messages of services.common.messages, bad input refused with a status.

Apart from the worker (server.py), so that it imports nothing of grpclib's health and reflection,
whose protobuf modules clash with grpcio's in one process (the unit tests import both servers).
"""

import asyncio
import logging
from typing import Any, Protocol

from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from services.common.config import ResponseModel
from services.common.messages import RecordMessages, RecordUploads, UploadTooLarge, undecodable
from services.common.pb import cars_grpc, cars_pb2
from services.common.records import BadRequest, RecordSource
from services.common.shapes import CARS, Shape
from services.grpc_grpclib.wire import count_received

log = logging.getLogger("protolab.grpc_grpclib")


class MessageStream(Protocol):
    """What RecordService uses of a call's stream (a grpclib Stream, or the metrics' CountedStream)."""

    async def recv_message(self) -> Any: ...

    async def send_message(self, message: Any) -> None: ...


class Codec(ProtoCodec):
    """grpclib's protobuf codec, answering bytes that do not parse with INVALID_ARGUMENT; its
    max_request_bytes is the largest message services.grpc_grpclib.wire.recv_message reads (past it
    RESOURCE_EXHAUSTED, before the message's bytes are read)."""

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            return super().decode(data, message_type)
        except DecodeError:
            raise GRPCError(Status.INVALID_ARGUMENT, undecodable(message_type)) from None


class Calls:
    """The RecordService calls in flight in this worker: above GRPC_MAX_CONCURRENT_RPCS refused
    with RESOURCE_EXHAUSTED, once the server stops refused with UNAVAILABLE, awaited at the stop.

    Plain calls around each handler (enter, then leave in a finally), not a context manager: every
    call passes here, and an async context manager costs a generator and two coroutines a call.
    """

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._active = 0
        self._stopping = False
        self._idle = asyncio.Event()  # set once stopping with no call left

    def enter(self) -> None:
        if self._stopping:
            raise GRPCError(Status.UNAVAILABLE, "The server is stopping")
        if self._limit is not None and self._active >= self._limit:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded")
        self._active += 1

    def leave(self) -> None:
        self._active -= 1
        if self._stopping and not self._active:
            self._idle.set()

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls; wait up to grace_seconds for those in flight."""
        self._stopping = True
        if not self._active:
            return
        try:
            await asyncio.wait_for(self._idle.wait(), grace_seconds)
        except TimeoutError:
            log.warning("grace period over: cancelling %d calls", self._active)


class RecordService(cars_grpc.RecordServiceBase):
    """RecordService, or the shape's own service with the same methods (shape.service): its messages
    (services.common.messages) under the response model, bad input refused with INVALID_ARGUMENT."""

    def __init__(
        self,
        source: RecordSource,
        model: ResponseModel,
        max_request_bytes: int,
        calls: Calls,
        shape: Shape = CARS,
    ) -> None:
        self._messages = RecordMessages(source, model, shape)
        self._uploads = RecordUploads(source.max_count, max_request_bytes, shape)
        self._calls = calls
        self._shape = shape

    def __mapping__(self) -> dict[str, Handler]:
        """RecordServiceBase's four handlers under the shape's service name, with its messages."""
        shape, prefix = self._shape, f"/{self._shape.service.full_name}/"
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

    async def _validated(self, stream: MessageStream) -> tuple[int, int | None]:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        try:
            return self._messages.validate(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None

    async def ListRecords(self, stream: MessageStream) -> None:
        self._calls.enter()
        try:
            count, offset = await self._validated(stream)
            await stream.send_message(self._messages.response(count, offset))
        finally:
            self._calls.leave()

    async def StreamRecords(self, stream: MessageStream) -> None:
        self._calls.enter()
        try:
            count, offset = await self._validated(stream)
            for message in self._messages.stream(count, offset):
                await stream.send_message(message)
                # grpclib's send returns without yielding while the flow-control window lasts: a
                # long stream would hold the worker's loop (other calls, a client's cancel) for
                # as long. grpc.aio yields on every write; so does this.
                await asyncio.sleep(0)
        finally:
            self._calls.leave()

    async def CreateRecords(self, stream: MessageStream) -> None:
        self._calls.enter()
        try:
            request = await stream.recv_message()
            if request is None:
                raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
            try:
                reply = self._uploads.create(request)
            except BadRequest as error:
                raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
            await stream.send_message(reply)
        finally:
            self._calls.leave()

    async def UploadRecords(self, stream: MessageStream) -> None:
        self._calls.enter()
        try:
            upload = self._uploads.start()
            try:
                # Each message's declared length counts against the call's total before it is read.
                with count_received(upload.count):
                    while (message := await stream.recv_message()) is not None:
                        upload.add(message)
                reply = upload.reply()
            except BadRequest as error:
                raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
            except UploadTooLarge as error:
                raise GRPCError(Status.RESOURCE_EXHAUSTED, str(error)) from None
            await stream.send_message(reply)
        finally:
            self._calls.leave()
