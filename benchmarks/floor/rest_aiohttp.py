"""aiohttp floor: GET and POST /records and /healthz on aiohttp and uvloop; nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import orjson
import uvloop
from aiohttp import web

from benchmarks.floor.bodies import BodyOf, body_maker
from benchmarks.floor.common import (
    KEEP_ALIVE_TIMEOUT_SECONDS,
    BadRequest,
    FloorSettings,
    Records,
    error_body,
    floor_settings,
    listen_socket,
    run,
)
from benchmarks.floor.shapes import FLOOR_SHAPES
from benchmarks.floor.uploads import Uploads

JSON = "application/json"
SERVING = orjson.dumps({"status": "SERVING"})


def _refused(status: int, allow: str | None = None) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A routing error as the lab answers it: its JSON body, and Allow on a 405."""
    body = error_body(HTTPStatus(status).phrase, status)
    headers = {"Allow": allow} if allow else None

    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=JSON, headers=headers)

    return answer


def build_app(settings: FloorSettings, body_of: BodyOf) -> web.Application:
    shape = FLOOR_SHAPES[settings.shape]
    uploads = Uploads(settings.max_count, settings.max_request_bytes, shape.records_of_body, shape.checksum)

    async def list_records(request: web.Request) -> web.Response:
        query = request.query
        try:
            body = body_of(query.get("count"), query.get("offset"))
        except BadRequest as error:
            return web.Response(status=400, body=error_body(str(error)), content_type=JSON)
        return web.Response(body=body, content_type=JSON)

    async def create_records(request: web.Request) -> web.Response:
        refused = uploads.refused_encoding(request.headers.get("Content-Encoding"))
        if refused is not None:
            return web.Response(status=refused[0], body=refused[1], content_type=JSON)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, body=uploads.too_large, content_type=JSON)
        except ConnectionError:  # the client went away mid-body, as the lab answers (499, unread)
            return web.Response(
                status=499, body=error_body("client closed the request", 499), content_type=JSON
            )
        except web.RequestPayloadError as error:
            return web.Response(status=400, body=error_body(f"body: {error}"), content_type=JSON)
        status, reply = uploads.answer(request.headers.get("Content-Type"), body)
        return web.Response(status=status, body=reply, content_type=JSON)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(body=SERVING, content_type=JSON)

    app = web.Application(client_max_size=settings.max_request_bytes)
    app.router.add_get("/records", list_records)
    app.router.add_post("/records", create_records)
    # Other methods and paths as the lab answers them (a route's other methods, then any path): after
    # the routes, so a served request never reaches them.
    app.router.add_route("*", "/records", _refused(405, "GET,HEAD,POST"))
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/healthz", _refused(405, "GET,HEAD"))
    app.router.add_route("*", "/{path:.*}", _refused(404))
    return app


async def _serve(
    settings: FloorSettings, app: web.Application, port: int, ready: Callable[[int], None]
) -> None:
    # No access log, and the lab's keep-alive and backlog (listen_socket).
    runner = web.AppRunner(
        app, access_log=None, keepalive_timeout=KEEP_ALIVE_TIMEOUT_SECONDS, auto_decompress=False
    )
    await runner.setup()
    sock = listen_socket(settings, port)
    site = web.SockSite(runner, sock)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await site.start()
    ready(sock.getsockname()[1])
    await stopping.wait()
    await runner.cleanup()


def main() -> None:
    settings = floor_settings("floor_rest_aiohttp")
    shape = FLOOR_SHAPES[settings.shape]
    app = build_app(settings, body_maker(settings, Records(settings, shape.flat), shape.documents))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, app, port, ready)))


if __name__ == "__main__":
    main()
