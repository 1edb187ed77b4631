"""grpc.aio floor: RecordService (or the SHAPE's service) and health on grpc.aio and uvloop; nothing else
(see common.py)."""

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import uvloop
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from benchmarks.floor.common import BadRequest, FloorSettings, FloorShape, Records, floor_settings, run
from benchmarks.floor.messages import Messages, Request, Uploads, UploadTooLarge, undecodable
from benchmarks.floor.shapes import FLOOR_SHAPES
from services.common.pb import cars_pb2, cars_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class RecordServicer(cars_pb2_grpc.RecordServiceServicer):
    """RecordService, or the shape's service with its four methods."""

    def __init__(self, messages: Messages, uploads: Uploads, shape: FloorShape) -> None:
        self._messages = messages
        self._uploads = uploads
        self._create, self._record = shape.create_message, shape.record_message

    async def ListRecords(self, request: Request | None, context: Context) -> Message:
        if request is None:  # bytes that did not parse (_lenient)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(Request))
        try:
            return self._messages.response(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def StreamRecords(self, request: Request | None, context: Context) -> AsyncIterator[Message]:
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(Request))
        try:
            messages = self._messages.stream(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        for message in messages:
            yield message

    async def CreateRecords(self, request: bytes, context: Context) -> cars_pb2.CreateRecordsReply:
        # Its bytes (_add_record_service): grpc.aio answers what its deserializer refuses with UNKNOWN.
        try:
            return self._uploads.create(self._create.FromString(request))
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(self._create))
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def UploadRecords(
        self, requests: AsyncIterator[bytes], context: Context
    ) -> cars_pb2.CreateRecordsReply:
        # Each message's bytes (_add_record_service): counted against the call's total, then decoded.
        records: list[Any] = []
        total = 0
        try:
            async for data in requests:
                total = self._uploads.counted(total, len(data))
                self._uploads.add(records, self._record.FromString(data))
            return self._uploads.reply(records)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(self._record))
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except UploadTooLarge as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))


def _lenient(data: bytes) -> Request | None:
    """ListRecordsRequest's deserializer: None for bytes that do not parse, which the handler refuses
    with INVALID_ARGUMENT (grpc.aio answers a deserializer's exception with UNKNOWN)."""
    try:
        return Request.FromString(data)
    except DecodeError:
        return None


def _add_record_service(servicer: RecordServicer, server: grpc.aio.Server, shape: FloorShape) -> None:
    """The generated add_RecordServiceServicer_to_server, but no deserializer raises: the uploads get
    their messages' bytes, ListRecords and StreamRecords None for bytes that do not parse."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ListRecords": grpc.unary_unary_rpc_method_handler(
            servicer.ListRecords, _lenient, shape.list_message.SerializeToString
        ),
        "StreamRecords": grpc.unary_stream_rpc_method_handler(
            servicer.StreamRecords, _lenient, shape.record_message.SerializeToString
        ),
        "CreateRecords": grpc.unary_unary_rpc_method_handler(
            servicer.CreateRecords, None, cars_pb2.CreateRecordsReply.SerializeToString
        ),
        "UploadRecords": grpc.stream_unary_rpc_method_handler(
            servicer.UploadRecords, None, cars_pb2.CreateRecordsReply.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(shape.service, handlers),))
    server.add_registered_method_handlers(shape.service, handlers)


async def _serve(
    settings: FloorSettings, servicer: RecordServicer, port: int, ready: Callable[[int], None]
) -> None:
    options = [
        # SO_REUSEPORT (grpc's default) only when workers share the port, so a busy port fails loudly.
        ("grpc.so_reuseport", int(settings.workers > 1)),
        ("grpc.max_receive_message_length", settings.max_request_bytes),  # else RESOURCE_EXHAUSTED
        ("grpc.max_concurrent_streams", 100),  # the lab's per-connection stream bound
    ]
    server = grpc.aio.server(options=options)
    shape = FLOOR_SHAPES[settings.shape]
    _add_record_service(servicer, server, shape)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", shape.service):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    bound = server.add_insecure_port(f"{host}:{port}")
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await server.start()
    ready(bound)
    await stopping.wait()
    await server.stop(grace=None)


def main() -> None:
    settings = floor_settings("floor_grpc_aio")
    shape = FLOOR_SHAPES[settings.shape]
    servicer = RecordServicer(
        Messages(settings, Records(settings, shape.flat), shape),
        Uploads(settings.max_count, settings.max_request_bytes, shape),
        shape,
    )
    run(settings, lambda port, ready: uvloop.run(_serve(settings, servicer, port, ready)))


if __name__ == "__main__":
    main()
