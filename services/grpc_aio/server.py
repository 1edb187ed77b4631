"""The grpc.aio worker: RecordService, health and reflection on a uvloop event loop."""

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import uvloop
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.config import GZIP, ResponseModel
from services.common.messages import RecordMessages, RecordUploads, UploadTooLarge, undecodable
from services.common.metrics import MetricBatch, worker_metrics
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import BadRequest, RecordSource
from services.common.shapes import CARS, Shape, shape_kit
from services.common.supervisor import WorkerContext
from services.grpc_aio.metrics import instrument_servicer

_KIB = 1024
# A pool record serializes to ~100 bytes (cars) to ~1.1 KB (text, its 1,024-character body); 2 KiB
# each leaves room for live mode's longer names.
_MAX_RECORD_BYTES = 2 * _KIB


class RecordServicer(cars_pb2_grpc.RecordServiceServicer):
    """RecordService, or the shape's own service with the same methods (shape.service): its messages
    (services.common.messages) under the response model, bad input aborted with INVALID_ARGUMENT."""

    def __init__(
        self, source: RecordSource, model: ResponseModel, max_request_bytes: int, shape: Shape = CARS
    ) -> None:
        self._messages = RecordMessages(source, model, shape)
        self._uploads = RecordUploads(source.max_count, max_request_bytes, shape)
        self._create = shape.create_message
        self._record = shape.record_message

    async def _validated(
        self, request: cars_pb2.ListRecordsRequest | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[int, int | None]:
        if request is None:  # its bytes did not parse (lenient_request)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(cars_pb2.ListRecordsRequest))
        try:
            return self._messages.validate(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))  # raises

    async def ListRecords(
        self, request: cars_pb2.ListRecordsRequest | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Message:
        count, offset = await self._validated(request, context)
        return self._messages.response(count, offset)

    async def StreamRecords(
        self, request: cars_pb2.ListRecordsRequest | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        count, offset = await self._validated(request, context)
        for message in self._messages.stream(count, offset):
            yield message

    async def CreateRecords(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cars_pb2.CreateRecordsReply:
        # The request's bytes (add_record_service), decoded here so that bad bytes are INVALID_ARGUMENT.
        try:
            return self._uploads.create(self._create.FromString(request))
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(self._create))
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def UploadRecords(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> cars_pb2.CreateRecordsReply:
        # Each message's bytes (add_record_service): counted against the call's total, then decoded.
        upload = self._uploads.start()
        try:
            async for data in requests:
                upload.add_bytes(data)
            return upload.reply()
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, undecodable(self._record))
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except UploadTooLarge as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))


class LimitedRecordServicer(RecordServicer):
    """RecordServicer with at most `limit` calls at once in this worker (GRPC_MAX_CONCURRENT_RPCS);
    the rest are refused with RESOURCE_EXHAUSTED. Only when a limit is set, so that no call pays
    for counting otherwise.

    grpc.aio's maximum_concurrent_rpcs would count health checks too: a saturated server would
    then fail its own health check, and be restarted for being busy.
    """

    def __init__(
        self, source: RecordSource, model: ResponseModel, max_request_bytes: int, limit: int, shape: Shape
    ) -> None:
        super().__init__(source, model, max_request_bytes, shape)
        self._limit = limit
        self._active = 0

    async def _enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self._active >= self._limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded")
        self._active += 1

    async def ListRecords(
        self, request: cars_pb2.ListRecordsRequest | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Message:
        await self._enter(context)
        try:
            return await super().ListRecords(request, context)
        finally:
            self._active -= 1

    async def StreamRecords(
        self, request: cars_pb2.ListRecordsRequest | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        await self._enter(context)
        try:
            async for message in super().StreamRecords(request, context):
                yield message
        finally:
            self._active -= 1

    async def CreateRecords(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cars_pb2.CreateRecordsReply:
        await self._enter(context)
        try:
            return await super().CreateRecords(request, context)
        finally:
            self._active -= 1

    async def UploadRecords(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> cars_pb2.CreateRecordsReply:
        await self._enter(context)
        try:
            return await super().UploadRecords(requests, context)
        finally:
            self._active -= 1


def record_servicer(
    source: RecordSource, model: ResponseModel, max_request_bytes: int, limit: int | None, shape: Shape = CARS
) -> RecordServicer:
    """The shape's servicer, limited to `limit` concurrent calls when given one."""
    if limit is None:
        return RecordServicer(source, model, max_request_bytes, shape)
    return LimitedRecordServicer(source, model, max_request_bytes, limit, shape)


def lenient_request(data: bytes) -> cars_pb2.ListRecordsRequest | None:
    """ListRecordsRequest's deserializer: None for bytes that do not parse, which the handler refuses
    with INVALID_ARGUMENT; grpc.aio answers a deserializer's exception with UNKNOWN (issue 37)."""
    try:
        return cars_pb2.ListRecordsRequest.FromString(data)
    except DecodeError:
        return None


def add_record_service(servicer: Any, server: grpc.aio.Server, shape: Shape = CARS) -> None:
    """cars_pb2_grpc.add_RecordServiceServicer_to_server, except that no deserializer raises: grpc.aio
    answers bytes its deserializer refuses with UNKNOWN, and logs a traceback for each, where the
    contract says INVALID_ARGUMENT. ListRecords and StreamRecords get None for such bytes
    (lenient_request); the uploads get their messages' bytes and decode them themselves, so that an
    UploadRecords call's bytes are counted against its total before any is decoded. Registered under
    the shape's service (cars: RecordService), with its messages' serializers."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ListRecords": grpc.unary_unary_rpc_method_handler(
            servicer.ListRecords, lenient_request, shape.list_message.SerializeToString
        ),
        "StreamRecords": grpc.unary_stream_rpc_method_handler(
            servicer.StreamRecords, lenient_request, shape.record_message.SerializeToString
        ),
        "CreateRecords": grpc.unary_unary_rpc_method_handler(
            servicer.CreateRecords, None, cars_pb2.CreateRecordsReply.SerializeToString
        ),
        "UploadRecords": grpc.stream_unary_rpc_method_handler(
            servicer.UploadRecords, None, cars_pb2.CreateRecordsReply.SerializeToString
        ),
    }
    name = shape.service.full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def _server_options(context: WorkerContext) -> list[tuple[str, int]]:
    return [
        # grpc sets SO_REUSEPORT by default, which would let a second server bind a busy
        # port silently; it is on only when the supervisor's workers share the port.
        ("grpc.so_reuseport", 1 if context.reuse_port else 0),
        # At most 100 streams at once on a connection, as the other HTTP/2 servers (grpc core's default is
        # unbounded); resets are grpc core's own to bound (its CVE-2023-44487 mitigation: the abuse
        # suite's flood gets few streams through). A k6 VU has one call in flight on its connection.
        ("grpc.max_concurrent_streams", 100),
        # Larger messages get RESOURCE_EXHAUSTED before any handler runs.
        ("grpc.max_receive_message_length", context.settings.max_request_bytes),
        # MAX_COUNT records plus room for the health and reflection responses.
        ("grpc.max_send_message_length", context.settings.max_count * _MAX_RECORD_BYTES + 64 * _KIB),
    ]


def _credentials(context: WorkerContext) -> grpc.ServerCredentials | None:
    settings = context.settings
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())]
    )


async def _serve(context: WorkerContext, metrics: MetricBatch | None) -> None:
    settings = context.settings
    # COMPRESSION=gzip: every response message gzip-compressed for a client that accepts it (grpc-go's,
    # k6's, advertises gzip); a compressed request is read whatever the setting.
    compression = grpc.Compression.Gzip if settings.compression == GZIP else grpc.Compression.NoCompression
    server = grpc.aio.server(options=_server_options(context), compression=compression)
    shape = shape_kit(settings.shape)
    servicer = record_servicer(
        context.records,
        settings.response_model,
        settings.max_request_bytes,
        settings.grpc_max_concurrent_rpcs,
        shape,
    )
    add_record_service(
        servicer if metrics is None else instrument_servicer(servicer, shape.service, metrics), server, shape
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", shape.service.full_name):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (shape.service.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    credentials = _credentials(context)
    address = f"{host}:{context.port}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)

    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with contextlib.nullcontext() if metrics is None else metrics.flushing():
        await server.start()
        context.report_listening(port)
        await stopping.wait()

        # Health first, so clients and load balancers move away while requests still succeed.
        await health_servicer.enter_graceful_shutdown()
        await asyncio.sleep(settings.shutdown_drain_seconds)
        await server.stop(grace=settings.shutdown_grace_seconds)


def worker_main(context: WorkerContext) -> None:
    """One worker process: serve until SIGTERM, drain, finish in-flight calls, return (exit 0)."""
    with worker_metrics(context.settings.metrics_enabled) as metrics:
        uvloop.run(_serve(context, metrics))
