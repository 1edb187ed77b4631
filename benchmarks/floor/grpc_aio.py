"""grpc.aio floor: RecordService and health; no metrics, call limit, size limits, reflection or drain."""

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from benchmarks.floor.common import serve
from services.common.config import ResponseModel
from services.common.messages import RecordMessages
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import BadRequest, RecordSource
from services.common.supervisor import WorkerContext

Context = grpc.aio.ServicerContext[Any, Any]


class RecordServicer(cars_pb2_grpc.RecordServiceServicer):
    """The lab's messages (services.common.messages); bad input aborted with INVALID_ARGUMENT."""

    def __init__(self, source: RecordSource, model: ResponseModel) -> None:
        self._messages = RecordMessages(source, model)

    async def ListRecords(
        self, request: cars_pb2.ListRecordsRequest, context: Context
    ) -> cars_pb2.ListRecordsResponse:
        try:
            count, offset = self._messages.validate(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return self._messages.response(count, offset)

    # Not measured by the floor preset; the runner's verification calls it.
    async def StreamRecords(
        self, request: cars_pb2.ListRecordsRequest, context: Context
    ) -> AsyncIterator[cars_pb2.Record]:
        try:
            count, offset = self._messages.validate(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        for message in self._messages.stream(count, offset):
            yield message


async def _serve(context: WorkerContext) -> None:
    settings = context.settings
    # grpc's default SO_REUSEPORT lets the workers share the port.
    server = grpc.aio.server()
    cars_pb2_grpc.add_RecordServiceServicer_to_server(
        RecordServicer(context.records, settings.response_model), server
    )
    # What the runner's health wait and verification ask: the server's and RecordService's status.
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", cars_pb2.DESCRIPTOR.services_by_name["RecordService"].full_name):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    port = server.add_insecure_port(f"{host}:{context.port}")
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await server.start()
    context.report_listening(port)
    await stopping.wait()
    await server.stop(grace=None)


def worker_main(context: WorkerContext) -> None:
    uvloop.run(_serve(context))


if __name__ == "__main__":
    serve("floor_grpc_aio", "grpc_aio", worker_main)
