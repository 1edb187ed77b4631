"""grpc.aio floor: RecordService and health on grpc.aio and uvloop; nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from benchmarks.floor.common import BadRequest, FloorSettings, Records, floor_settings, run
from benchmarks.floor.messages import Messages, Request
from services.common.pb import cars_pb2, cars_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
RECORD_SERVICE = cars_pb2.DESCRIPTOR.services_by_name["RecordService"].full_name


class RecordServicer(cars_pb2_grpc.RecordServiceServicer):
    def __init__(self, messages: Messages) -> None:
        self._messages = messages

    async def ListRecords(self, request: Request, context: Context) -> cars_pb2.ListRecordsResponse:
        try:
            return self._messages.response(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def StreamRecords(self, request: Request, context: Context) -> AsyncIterator[cars_pb2.Record]:
        try:
            messages = self._messages.stream(request)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        for message in messages:
            yield message


async def _serve(
    settings: FloorSettings, messages: Messages, port: int, ready: Callable[[int], None]
) -> None:
    # SO_REUSEPORT (grpc's default) only when workers share the port, so a busy port fails loudly.
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(settings.workers > 1))])
    cars_pb2_grpc.add_RecordServiceServicer_to_server(RecordServicer(messages), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", RECORD_SERVICE):
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
    messages = Messages(settings, Records(settings))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, messages, port, ready)))


if __name__ == "__main__":
    main()
