"""Quart-on-Hypercorn floor: /records and /healthz; no metrics, hooks, query regex, JSON errors, drain."""

import asyncio
import signal

import orjson
import uvloop
from hypercorn.asyncio import serve as hypercorn_serve
from quart import Quart, Response, request

from benchmarks.floor.common import FloorBodies, serve
from services.common.rest import JSON, LISTEN_BACKLOG, error_body
from services.common.supervisor import WorkerContext, listen_socket
from services.rest_quart.server import hypercorn_config

_SERVING = orjson.dumps({"status": "SERVING"})


def build_app(bodies: FloorBodies) -> Quart:
    """The bare Quart app, which the Granian floor (benchmarks.floor.rest_granian) serves too."""
    app = Quart(__name__)

    @app.get("/records")
    async def list_records() -> Response:
        try:
            body = bodies.body(request.args.get("count"), request.args.get("offset"))
        except ValueError as error:
            return Response(error_body(400, str(error)), status=400, content_type=JSON)
        return Response(body, content_type=JSON)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(_SERVING, content_type=JSON)

    return app


async def _serve(context: WorkerContext) -> None:
    settings = context.settings
    app = build_app(FloorBodies(context.records, settings.response_model))
    sock = listen_socket(context, LISTEN_BACKLOG)
    port = sock.getsockname()[1]
    # The lab's Hypercorn configuration (services/rest_quart/hypercorn.toml and the environment);
    # serve() runs one worker's server, as each of the lab's Hypercorn workers does.
    config = hypercorn_config(settings, 1, sock.detach())

    @app.before_serving
    async def started() -> None:
        context.report_listening(port)

    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await hypercorn_serve(app, config, shutdown_trigger=stopping.wait)


def worker_main(context: WorkerContext) -> None:
    uvloop.run(_serve(context))


if __name__ == "__main__":
    serve("floor_rest_quart", "rest_quart", worker_main)
