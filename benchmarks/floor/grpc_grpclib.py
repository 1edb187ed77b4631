"""grpclib floor: RecordService and health; no metrics, call limit, size-checking codec, reflection, drain."""

import asyncio
import signal
from typing import Any

import uvloop
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.service import Health
from grpclib.server import Server, Stream

from benchmarks.floor.common import serve
from services.common.config import ResponseModel
from services.common.messages import RecordMessages
from services.common.pb import cars_grpc, cars_pb2
from services.common.records import BadRequest, RecordSource
from services.common.rest import LISTEN_BACKLOG
from services.common.supervisor import WorkerContext, listen_socket

Request = cars_pb2.ListRecordsRequest


class RecordService(cars_grpc.RecordServiceBase):
    """The lab's messages (services.common.messages); bad input refused with INVALID_ARGUMENT."""

    def __init__(self, source: RecordSource, model: ResponseModel) -> None:
        self._messages = RecordMessages(source, model)

    async def _validated(self, stream: Stream[Request, Any]) -> tuple[int, int | None]:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        try:
            return self._messages.validate(request)
        except BadRequest as error:
            raise GRPCError(Status.INVALID_ARGUMENT, str(error)) from None

    async def ListRecords(self, stream: Stream[Request, cars_pb2.ListRecordsResponse]) -> None:
        count, offset = await self._validated(stream)
        await stream.send_message(self._messages.response(count, offset))

    # Not measured by the floor preset; the runner's verification calls it.
    async def StreamRecords(self, stream: Stream[Request, cars_pb2.Record]) -> None:
        count, offset = await self._validated(stream)
        for message in self._messages.stream(count, offset):
            await stream.send_message(message)


async def _serve(context: WorkerContext) -> None:
    records = RecordService(context.records, context.settings.response_model)
    # No checks: SERVING for the server ("") and RecordService, what the runner's health wait asks.
    server = Server([records, Health({records: []})])
    sock = listen_socket(context, LISTEN_BACKLOG)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await server.start(sock=sock, backlog=LISTEN_BACKLOG)
    context.report_listening(sock.getsockname()[1])
    await stopping.wait()
    server.close()
    await server.wait_closed()


def worker_main(context: WorkerContext) -> None:
    uvloop.run(_serve(context))


if __name__ == "__main__":
    serve("floor_grpc_grpclib", "grpc_grpclib", worker_main)
