"""grpclib floor: RecordService and health on grpclib and uvloop; nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import uvloop
from google.protobuf.message import DecodeError
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.health.service import Health
from grpclib.server import Server, Stream

from benchmarks.floor.common import (
    LISTEN_BACKLOG,
    BadRequest,
    FlatRecord,
    FloorSettings,
    Records,
    floor_settings,
    listen_socket,
    run,
)
from benchmarks.floor.messages import Messages, Request, Uploads, undecodable
from services.common.pb import cars_grpc, cars_pb2


class Codec(ProtoCodec):
    """grpclib has no receive limit: a message over max_request_bytes is refused once read, as the lab's.
    An undecodable ListRecordsRequest is UNKNOWN "Error parsing message", as grpc.aio and the lab say
    (grpclib's own answer: UNKNOWN "Internal Server Error"); an upload's is its handler's to refuse."""

    def __init__(self, max_request_bytes: int) -> None:
        self._max = max_request_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._max:
            message = f"Received message larger than max ({len(data)} vs. {self._max})"
            raise GRPCError(Status.RESOURCE_EXHAUSTED, message)
        try:
            return super().decode(data, message_type)
        except DecodeError:
            if message_type is not Request:
                raise
            raise GRPCError(Status.UNKNOWN, "Error parsing message") from None


class RecordService(cars_grpc.RecordServiceBase):
    def __init__(self, messages: Messages, uploads: Uploads) -> None:
        self._messages = messages
        self._uploads = uploads

    async def _request(self, stream: Stream[Request, Any]) -> Request:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        return request

    async def ListRecords(self, stream: Stream[Request, cars_pb2.ListRecordsResponse]) -> None:
        request = await self._request(stream)
        try:
            response = self._messages.response(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        await stream.send_message(response)

    async def StreamRecords(self, stream: Stream[Request, cars_pb2.Record]) -> None:
        request = await self._request(stream)
        try:
            messages = self._messages.stream(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        for message in messages:
            await stream.send_message(message)

    async def CreateRecords(
        self, stream: Stream[cars_pb2.CreateRecordsRequest, cars_pb2.CreateRecordsReply]
    ) -> None:
        try:
            request = await stream.recv_message()
        except DecodeError:
            raise GRPCError(Status.INVALID_ARGUMENT, undecodable(cars_pb2.CreateRecordsRequest)) from None
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        try:
            reply = self._uploads.create(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
        await stream.send_message(reply)

    async def UploadRecords(self, stream: Stream[cars_pb2.Record, cars_pb2.CreateRecordsReply]) -> None:
        records: list[FlatRecord] = []
        try:
            while (message := await stream.recv_message()) is not None:
                self._uploads.add(records, message)
            reply = self._uploads.reply(records)
        except DecodeError:
            raise GRPCError(Status.INVALID_ARGUMENT, undecodable(cars_pb2.Record)) from None
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None
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
    records = RecordService(Messages(settings, Records(settings)), Uploads(settings.max_count))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, records, port, ready)))


if __name__ == "__main__":
    main()
