"""Quart-on-Granian floor: the Quart floor app on Granian; no metrics, hooks, query regex, drain, OpenAPI."""

import asyncio
import signal
import socket
from typing import Any

import uvloop
from granian._granian import SocketHolder
from granian.constants import HTTPModes, Interfaces
from granian.server.embed import Server

from benchmarks.floor.common import FloorBodies, serve
from benchmarks.floor.rest_quart import build_app
from services.common.rest import LISTEN_BACKLOG
from services.common.supervisor import WorkerContext, listen_socket


class _SocketServer(Server):
    """Granian's embedded server on a socket opened here, as the lab's (services/rest_granian/server.py):
    Granian binds from an address and port only, so port 0 could not be reported."""

    def __init__(self, sock: socket.socket, **options: Any) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(address=host, port=port, **options)
        self._socket = sock

    def _init_shared_socket(self) -> None:
        self._ssp = None
        # Granian's stub declares neither SocketHolder's arguments nor this attribute's type.
        self._shd = SocketHolder(self._socket.detach(), False, LISTEN_BACKLOG)  # type: ignore[call-arg,assignment]


async def _serve(context: WorkerContext) -> None:
    app = build_app(FloorBodies(context.records, context.settings.response_model))
    sock = listen_socket(context, LISTEN_BACKLOG)
    port = sock.getsockname()[1]

    @app.before_serving
    async def started() -> None:
        context.report_listening(port)

    # The lab's granian-h1 options: auto mode (what its default ALPN_PROTOCOLS choose), ASGI with
    # the lifespan, no websockets, its backlog; logging off (the lab's logs warnings to stderr).
    server = _SocketServer(
        sock,
        target=app,
        interface=Interfaces.ASGI,
        http=HTTPModes.auto,
        websockets=False,
        backlog=LISTEN_BACKLOG,
        log_enabled=False,
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    serving = asyncio.create_task(server.serve())
    await asyncio.wait({serving, asyncio.create_task(stopping.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.stop()  # type: ignore[no-untyped-call]
    await serving


def worker_main(context: WorkerContext) -> None:
    uvloop.run(_serve(context))


if __name__ == "__main__":
    serve("floor_rest_granian", "rest_granian", worker_main)
