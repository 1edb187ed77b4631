"""Quart-on-Granian floor: the Quart floor app (benchmarks.floor.rest_quart) on Granian's embedded
server, HTTP/1.1; nothing else (see common.py)."""

import asyncio
import signal
import socket
from collections.abc import Callable
from typing import Any

import uvloop
from granian._granian import SocketHolder
from granian.constants import HTTPModes, Interfaces
from granian.server.embed import Server
from quart import Quart

from benchmarks.floor.bodies import body_maker
from benchmarks.floor.common import LISTEN_BACKLOG, FloorSettings, Records, floor_settings, listen_socket, run
from benchmarks.floor.rest_quart import build_app
from benchmarks.floor.shapes import FLOOR_SHAPES


class _SocketServer(Server):
    """Granian's embedded server on a socket opened here: Granian binds from an address and port
    only, so port 0 could not be reported."""

    def __init__(self, sock: socket.socket, **options: Any) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(address=host, port=port, **options)
        self._socket = sock

    def _init_shared_socket(self) -> None:
        self._ssp = None
        # Granian's stub declares neither SocketHolder's arguments nor this attribute's type.
        self._shd = SocketHolder(self._socket.detach(), False, LISTEN_BACKLOG)  # type: ignore[call-arg,assignment]


async def _serve(settings: FloorSettings, app: Quart, port: int, ready: Callable[[int], None]) -> None:
    sock = listen_socket(settings, port)
    bound = sock.getsockname()[1]

    @app.before_serving
    async def started() -> None:
        ready(bound)

    # ASGI with the lifespan, HTTP/1.1 (the lab's granian-h1), no websockets, no logging.
    server = _SocketServer(
        sock,
        target=app,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        backlog=LISTEN_BACKLOG,
        backpressure=65_536,  # as the lab's (services/rest_granian/server.py): idle clients lock no one out
        log_enabled=False,
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    serving = asyncio.create_task(server.serve())
    await asyncio.wait({serving, asyncio.create_task(stopping.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.stop()  # type: ignore[no-untyped-call]
    await serving


def main() -> None:
    settings = floor_settings("floor_rest_granian")
    shape = FLOOR_SHAPES[settings.shape]
    app = build_app(settings, body_maker(settings, Records(settings, shape.flat), shape.documents))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, app, port, ready)))


if __name__ == "__main__":
    main()
