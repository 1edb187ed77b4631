"""grpclib floor: RecordService and health on grpclib and uvloop; nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import uvloop
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.service import Health
from grpclib.server import Server, Stream

from benchmarks.floor.common import (
    LISTEN_BACKLOG,
    BadRequest,
    FloorSettings,
    Records,
    floor_settings,
    listen_socket,
    run,
)
from benchmarks.floor.messages import Messages, Request
from services.common.pb import cars_grpc, cars_pb2


class RecordService(cars_grpc.RecordServiceBase):
    def __init__(self, messages: Messages) -> None:
        self._messages = messages

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


async def _serve(
    settings: FloorSettings, messages: Messages, port: int, ready: Callable[[int], None]
) -> None:
    records = RecordService(messages)
    # No checks: SERVING for the server ("") and RecordService, what the runner's health wait asks.
    server = Server([records, Health({records: []})])
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
    messages = Messages(settings, Records(settings))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, messages, port, ready)))


if __name__ == "__main__":
    main()
