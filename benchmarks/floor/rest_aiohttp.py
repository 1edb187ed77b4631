"""aiohttp floor: /records and /healthz; no metrics, middleware, query regex, JSON 404/405, drain, OpenAPI."""

import asyncio
import signal

import orjson
import uvloop
from aiohttp import web

from benchmarks.floor.common import FloorBodies, serve
from services.common.rest import JSON, KEEP_ALIVE_TIMEOUT_SECONDS, LISTEN_BACKLOG, error_body
from services.common.supervisor import WorkerContext

_SERVING = orjson.dumps({"status": "SERVING"})


def build_app(bodies: FloorBodies) -> web.Application:
    async def list_records(request: web.Request) -> web.Response:
        try:
            body = bodies.body(request.query.get("count"), request.query.get("offset"))
        except ValueError as error:
            return web.Response(status=400, body=error_body(400, str(error)), content_type=JSON)
        return web.Response(body=body, content_type=JSON)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(body=_SERVING, content_type=JSON)

    app = web.Application()
    app.router.add_get("/records", list_records)
    app.router.add_get("/healthz", healthz)
    return app


async def _serve(context: WorkerContext) -> None:
    settings = context.settings
    # The lab's server settings: no access log, its keep-alive and backlog.
    runner = web.AppRunner(
        build_app(FloorBodies(context.records, settings.response_model)),
        access_log=None,
        keepalive_timeout=KEEP_ALIVE_TIMEOUT_SECONDS,
    )
    await runner.setup()
    site = web.TCPSite(
        runner, settings.host, context.port, backlog=LISTEN_BACKLOG, reuse_port=context.reuse_port
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await site.start()
    context.report_listening(site.port)
    await stopping.wait()
    await runner.cleanup()


def worker_main(context: WorkerContext) -> None:
    uvloop.run(_serve(context))


if __name__ == "__main__":
    serve("floor_rest_aiohttp", "rest_aiohttp", worker_main)
