"""The grpc.aio worker: RecordService, health and reflection on a uvloop event loop."""

import asyncio
import contextlib
import signal
from collections import OrderedDict
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.metrics import MetricBatch, worker_metrics
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import BadRequest, Record, RecordSource
from services.common.supervisor import WorkerContext
from services.grpc_aio.metrics import instrument_servicer

RECORD_SERVICE = cars_pb2.DESCRIPTOR.services_by_name["RecordService"]
_KIB = 1024
# Requests are a few bytes; a low cap stops a client from making a worker buffer megabytes.
_MAX_REQUEST_BYTES = 64 * _KIB
# A pool record serializes to ~100 bytes; 1 KiB each leaves room for live mode's longer names.
_MAX_RECORD_BYTES = 1 * _KIB


def _to_message(record: Record) -> cars_pb2.Record:
    # ~10x faster than json_format.ParseDict; driverId is the one JSON name that differs.
    driver = record["driver"]
    return cars_pb2.Record(
        car=record["car"],
        driver=cars_pb2.Driver(
            firstname=driver["firstname"], lastname=driver["lastname"], driver_id=driver["driverId"]
        ),
    )


class _ResponseCache:
    """ListRecordsResponse messages by (start, count), least recently used evicted past a record budget.

    Filling a response copies every Record into it (upb cannot share sub-messages): ~6x the
    cost of serializing it, work the REST servers never do, as their slices share the pool's
    dicts. So responses are built once and then only serialized, per call, like REST's
    orjson.dumps of a slice. A budget of one rotation (pool + MAX_COUNT records, ~300 bytes
    each) holds every response of a fixed-count load whose count divides the pool size.
    """

    def __init__(self, window: list[cars_pb2.Record]) -> None:
        self._window = window
        self._budget_records = len(window)
        self._cached_records = 0
        self._responses: OrderedDict[tuple[int, int], cars_pb2.ListRecordsResponse] = OrderedDict()

    def get(self, start: int, count: int) -> cars_pb2.ListRecordsResponse:
        key = (start, count)
        response = self._responses.get(key)
        if response is not None:
            self._responses.move_to_end(key)
            return response
        response = cars_pb2.ListRecordsResponse(records=self._window[start : start + count])
        self._responses[key] = response
        self._cached_records += count
        while self._cached_records > self._budget_records:
            (_, evicted_count), _ = self._responses.popitem(last=False)
            self._cached_records -= evicted_count
        return response


class _CallLimit:
    """At most `limit` RecordService calls at once in this worker (None: unlimited); the rest are
    refused with RESOURCE_EXHAUSTED.

    grpc.aio's maximum_concurrent_rpcs would count health checks too: a saturated server would
    then fail its own health check, and be restarted for being busy.
    """

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._active = 0

    @contextlib.asynccontextmanager
    async def slot(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        if self._limit is not None and self._active >= self._limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded")
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1


class RecordServicer(cars_pb2_grpc.RecordServiceServicer):
    """Serves the pool as protobuf messages built at start-up (or live Faker records, converted per call)."""

    def __init__(self, source: RecordSource, max_concurrent_calls: int | None = None) -> None:
        self._source = source
        self._calls = _CallLimit(max_concurrent_calls)
        self._window: list[cars_pb2.Record] = []
        if not source.live:
            # The same layout as RecordSource's window (the pool, then its first max_count
            # records again), so any (count, offset) is one slice of shared messages.
            pool = [_to_message(record) for record in source.pool]
            self._window = [pool[i % len(pool)] for i in range(len(pool) + source.max_count)]
        self._responses = _ResponseCache(self._window)

    async def _validated(
        self, request: cars_pb2.ListRecordsRequest, context: grpc.aio.ServicerContext
    ) -> tuple[int, int | None]:
        count = request.count if request.HasField("count") else None
        offset = request.offset if request.HasField("offset") else None
        try:
            return self._source.validate(count, offset)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))  # raises

    def _live_messages(self, count: int, offset: int | None) -> list[cars_pb2.Record]:
        return [_to_message(record) for record in self._source.records(count, offset)]

    async def ListRecords(
        self, request: cars_pb2.ListRecordsRequest, context: grpc.aio.ServicerContext
    ) -> cars_pb2.ListRecordsResponse:
        async with self._calls.slot(context):
            count, offset = await self._validated(request, context)
            if self._source.live:
                return cars_pb2.ListRecordsResponse(records=self._live_messages(count, offset))
            return self._responses.get(self._source.start(count, offset), count)

    async def StreamRecords(
        self, request: cars_pb2.ListRecordsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cars_pb2.Record]:
        async with self._calls.slot(context):
            count, offset = await self._validated(request, context)
            if self._source.live:
                messages = self._live_messages(count, offset)
            else:
                start = self._source.start(count, offset)
                messages = self._window[start : start + count]
            for message in messages:
                yield message


def _server_options(context: WorkerContext) -> list[tuple[str, int]]:
    return [
        # grpc sets SO_REUSEPORT by default, which would let a second server bind a busy
        # port silently; it is on only when the supervisor's workers share the port.
        ("grpc.so_reuseport", 1 if context.reuse_port else 0),
        ("grpc.max_receive_message_length", _MAX_REQUEST_BYTES),
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
    server = grpc.aio.server(options=_server_options(context))
    servicer = RecordServicer(context.records, settings.grpc_max_concurrent_rpcs)
    cars_pb2_grpc.add_RecordServiceServicer_to_server(
        servicer if metrics is None else instrument_servicer(servicer, RECORD_SERVICE, metrics), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", RECORD_SERVICE.full_name):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (RECORD_SERVICE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
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
