"""Quart-on-Hypercorn floor: GET and POST /records and /healthz on Quart, one Hypercorn server on uvloop;
nothing else (see common.py)."""

import asyncio
import signal
from collections.abc import Callable
from http import HTTPStatus

import orjson
import uvloop
from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from benchmarks.floor.bodies import BodyOf, body_maker
from benchmarks.floor.common import (
    KEEP_ALIVE_TIMEOUT_SECONDS,
    LISTEN_BACKLOG,
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
from services.common import hypercorn_limits
from services.common.hypercorn_limits import MAX_REQUESTS_PER_CONNECTION

JSON = "application/json"
SERVING = orjson.dumps({"status": "SERVING"})


def build_app(settings: FloorSettings, body_of: BodyOf) -> Quart:
    """The Quart app, which the Granian floor (benchmarks.floor.rest_granian) serves too."""
    shape = FLOOR_SHAPES[settings.shape]
    uploads = Uploads(settings.max_count, settings.max_request_bytes, shape.records_of_body, shape.checksum)
    app = Quart(__name__)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False  # OPTIONS is a 405, as in the lab
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes  # reading more raises RequestEntityTooLarge

    @app.get("/records")
    async def list_records() -> Response:
        args = request.args
        try:
            body = body_of(args.get("count"), args.get("offset"))
        except BadRequest as error:
            return Response(error_body(str(error)), status=400, content_type=JSON)
        return Response(body, content_type=JSON)

    @app.post("/records")
    async def create_records() -> Response:
        refused = uploads.refused_encoding(request.headers.get("Content-Encoding"))
        if refused is not None:
            return Response(refused[1], status=refused[0], content_type=JSON)
        try:
            body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        except RequestEntityTooLarge:  # the rest of the body unread: the connection closes
            return Response(uploads.too_large, status=413, headers={"Connection": "close"}, content_type=JSON)
        status, reply = uploads.answer(request.headers.get("Content-Type"), body)
        return Response(reply, status=status, content_type=JSON)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(SERVING, content_type=JSON)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        """Routing errors (404, 405 with Allow) as the lab answers them: its JSON body."""
        status = error.code or 500
        allow = dict(error.get_headers()).get("Allow")
        headers = {"Allow": allow} if allow else None
        return Response(error_body(HTTPStatus(status).phrase, status), status, headers, content_type=JSON)

    return app


def hypercorn_config(fd: int) -> Config:
    """What the lab's Hypercorn sets that a load test sees: no access log, its keep-alive and
    backlog, and the lab's per-connection budget (services/common/hypercorn_limits.py) instead of
    Hypercorn's default 1,000 requests a connection."""
    config = Config()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    config.backlog = LISTEN_BACKLOG
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_SECONDS
    config.keep_alive_max_requests = MAX_REQUESTS_PER_CONNECTION
    return config


async def _serve(settings: FloorSettings, app: Quart, port: int, ready: Callable[[int], None]) -> None:
    sock = listen_socket(settings, port)
    bound = sock.getsockname()[1]
    config = hypercorn_config(sock.detach())

    @app.before_serving
    async def started() -> None:
        ready(bound)

    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await serve(app, config, shutdown_trigger=stopping.wait)


def main() -> None:
    settings = floor_settings("floor_rest_quart")
    hypercorn_limits.install()
    shape = FLOOR_SHAPES[settings.shape]
    app = build_app(settings, body_maker(settings, Records(settings, shape.flat), shape.documents))
    run(settings, lambda port, ready: uvloop.run(_serve(settings, app, port, ready)))


if __name__ == "__main__":
    main()
