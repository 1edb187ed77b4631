"""The aiohttp worker: /records, /healthz and /openapi.json over HTTP/1.1 on a uvloop event loop."""

import asyncio
import contextlib
import logging
import signal
import time

import orjson
import uvloop
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from services.common.config import Settings
from services.common.metrics import HttpServerDurations, MetricBatch, worker_metrics
from services.common.records import BadRequest, RecordSource
from services.common.rest import (
    JSON,
    KEEP_ALIVE_TIMEOUT_SECONDS,
    LISTEN_BACKLOG,
    Health,
    RecordBodies,
    error_body,
    openapi_document,
    route_label,
)
from services.common.supervisor import WorkerContext
from services.common.tls import server_ssl_context

log = logging.getLogger("protolab.rest_aiohttp")


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routing errors (404, 405) as JSON bodies; anything unexpected as a logged JSON 500."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        allow = error.headers.get("Allow")
        return _json(error.status, error_body(error.status), {"Allow": allow} if allow else None)
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return _json(500, error_body(500))


def _observe(durations: HttpServerDurations) -> Middleware:
    """Record every response in the HTTP duration histogram, errors included."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        response = await handler(request)
        elapsed = time.perf_counter() - started
        resource = request.match_info.route.resource  # None when no route matched (404, 405)
        route = route_label(None if resource is None else resource.canonical, request.path)
        version = f"{request.version.major}.{request.version.minor}"
        durations.observe(request.method, route, response.status, version, elapsed)
        return response

    return observe


def build_app(
    records: RecordSource, health: Health, settings: Settings, metrics: MetricBatch | None
) -> web.Application:
    """The application: its routes, and the metrics middleware when given a batch to record into."""
    middlewares: list[Middleware] = [_json_errors]
    if metrics is not None:
        middlewares.insert(0, _observe(HttpServerDurations(metrics)))
    app = web.Application(middlewares=middlewares)
    openapi = orjson.dumps(openapi_document(settings.max_count, settings.default_count))
    bodies = RecordBodies(records, settings.response_model)

    async def list_records(request: web.Request) -> web.Response:
        try:
            body = bodies.body(request.query.get("count"), request.query.get("offset"))
        except BadRequest as error:
            return _json(400, error_body(400, str(error)))
        return _json(200, body)

    async def healthz(_request: web.Request) -> web.Response:
        status, body = health.response()
        return _json(status, body)

    async def openapi_json(_request: web.Request) -> web.Response:
        return _json(200, openapi)

    app.router.add_get("/records", list_records)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.json", openapi_json)
    return app


async def _serve(context: WorkerContext, metrics: MetricBatch | None) -> None:
    settings = context.settings
    health = Health()
    runner = web.AppRunner(
        build_app(context.records, health, settings, metrics),
        access_log=None,  # a log line per request would cost more than the request
        keepalive_timeout=KEEP_ALIVE_TIMEOUT_SECONDS,
        shutdown_timeout=settings.shutdown_grace_seconds,
    )
    await runner.setup()
    site = web.TCPSite(
        runner,
        settings.host,
        context.port,
        ssl_context=server_ssl_context(settings, ["http/1.1"]),
        backlog=LISTEN_BACKLOG,
        reuse_port=context.reuse_port,
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with contextlib.nullcontext() if metrics is None else metrics.flushing():
        await site.start()
        context.report_listening(site.port)
        await stopping.wait()

        # Health first, so clients and load balancers move away while requests still succeed.
        health.start_draining()
        await asyncio.sleep(settings.shutdown_drain_seconds)
        # Stops accepting, closes idle connections, waits for in-flight requests up to shutdown_timeout.
        await runner.cleanup()


def worker_main(context: WorkerContext) -> None:
    """One worker process: serve until SIGTERM, drain, finish in-flight requests, return (exit 0)."""
    with worker_metrics(context.settings.metrics_enabled) as metrics:
        uvloop.run(_serve(context, metrics))
