"""The aiohttp worker: /records (GET and the POST upload), /healthz and /openapi.json over HTTP/1.1 on
a uvloop event loop."""

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable

import orjson
import uvloop
from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.typedefs import Handler

from services.common.config import Settings
from services.common.metrics import HttpServerDurations, MetricBatch, worker_metrics
from services.common.records import BadRequest, RecordSource
from services.common.rest import (
    JSON,
    KEEP_ALIVE_TIMEOUT_SECONDS,
    LISTEN_BACKLOG,
    ROUTES,
    Health,
    RecordBodies,
    ResponseEncoding,
    Uploads,
    error_body,
    openapi_document,
    route_label,
)
from services.common.shapes import shape_kit
from services.common.supervisor import WorkerContext
from services.common.tls import count_handshakes, server_ssl_context

log = logging.getLogger("protolab.rest_aiohttp")
# The methods each route answers, as aiohttp's 405 says: GET (and HEAD, which aiohttp adds to each
# GET route), and POST on /records.
_ALLOWED = {"/records": "GET,HEAD,POST", "/healthz": "GET,HEAD", "/openapi.json": "GET,HEAD"}
# The network_protocol_version label of the versions clients send, not formatted per request.
_VERSIONS = {HttpVersion11: "1.1", HttpVersion10: "1.0"}

Respond = Callable[[web.Request], web.Response]  # a route's answer; it awaits nothing
AwaitRespond = Callable[[web.Request], Awaitable[web.Response]]  # one that awaits (reads the body)

# The status nginx records for a client that closed its request before the answer: no client reads it,
# the metrics count it as an abort instead of a server error.
CLIENT_CLOSED_REQUEST = 499


class _AnyPath(web.PlainResource):
    """A resource every request path matches ("*" and absolute-form too), registered last so that
    it takes only what no route matched (aiohttp 3.14, pinned, tries resources in order)."""

    def __init__(self) -> None:
        super().__init__("/")

    def _match(self, path: str) -> dict[str, str] | None:
        return {}

    def raw_match(self, path: str) -> bool:
        return True


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


def _internal_error(request: web.Request) -> web.Response:
    log.exception("unexpected error serving %s %s", request.method, request.path)
    return _json(500, error_body(500))


def _observe(
    durations: HttpServerDurations, request: web.Request, route: str | None, status: int, started: float
) -> None:
    """Record a request's status and time since started into durations."""
    elapsed = time.perf_counter() - started
    version = request.version
    durations.observe(
        request.method,
        route or route_label(None, request.path),
        status,
        _VERSIONS.get(version) or f"{version.major}.{version.minor}",
        elapsed,
    )


def _serving(respond: Respond, route: str | None, durations: HttpServerDurations | None) -> Handler:
    """The aiohttp handler of a route: respond, with anything unexpected answered as a logged JSON
    500, timed into durations (when given) under the route's label (None: the path's, see
    route_label).

    One coroutine per request and no middleware: aiohttp runs each middleware (and, once there is
    one, its own _fix_request_current_app) as a further call per request.
    """

    if durations is None:

        async def untimed(request: web.Request) -> web.Response:
            try:
                return respond(request)
            except Exception:
                return _internal_error(request)

        return untimed

    async def timed(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            response = respond(request)
        except Exception:
            response = _internal_error(request)
        _observe(durations, request, route, response.status, started)
        return response

    return timed


def _serving_awaited(respond: AwaitRespond, route: str, durations: HttpServerDurations | None) -> Handler:
    """_serving for a route whose answer awaits (the upload reads its body)."""

    if durations is None:

        async def untimed(request: web.Request) -> web.Response:
            try:
                return await respond(request)
            except Exception:
                return _internal_error(request)

        return untimed

    async def timed(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            response = await respond(request)
        except Exception:
            response = _internal_error(request)
        _observe(durations, request, route, response.status, started)
        return response

    return timed


def build_app(
    records: RecordSource, health: Health, settings: Settings, metrics: MetricBatch | None
) -> web.Application:
    """The application: its routes, timed into the batch when given one (metrics on)."""
    # aiohttp refuses a body over client_max_size while reading it (HTTPRequestEntityTooLarge).
    app = web.Application(client_max_size=settings.max_request_bytes)
    durations = None if metrics is None else HttpServerDurations(metrics)
    openapi = orjson.dumps(
        openapi_document(settings.max_count, settings.default_count, settings.max_request_bytes)
    )
    shape = shape_kit(settings.shape)  # the record shape, for the process's life (SHAPE)
    bodies = RecordBodies(records, settings.response_model, shape)
    encoding = ResponseEncoding(settings.compression)
    uploads = Uploads(settings.max_count, settings.max_request_bytes, shape)

    def list_records(request: web.Request) -> web.Response:
        query = request.query
        try:
            body = bodies.body(query.get("count"), query.get("offset"))
        except BadRequest as error:
            return _json(400, error_body(400, str(error)))
        return _json(200, *encoding.encode(body, request.headers.get("Accept-Encoding")))

    async def create_records(request: web.Request) -> web.Response:
        refused = uploads.refused_encoding(request.headers.get("Content-Encoding"))
        if refused is not None:
            return _json(*refused)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _json(413, uploads.too_large)
        except ConnectionError:  # the client went away mid-body: an abort, not a server error
            return _json(
                CLIENT_CLOSED_REQUEST, error_body(CLIENT_CLOSED_REQUEST, "client closed the request")
            )
        except web.RequestPayloadError as error:  # a body its framing cannot deliver (chunked encoding)
            return _json(400, error_body(400, f"body: {error}"))
        status, reply = uploads.answer(request.headers.get("Content-Type"), body)
        return _json(status, reply)

    def healthz(_request: web.Request) -> web.Response:
        status, body = health.response()
        return _json(status, body)

    def openapi_json(_request: web.Request) -> web.Response:
        return _json(200, openapi)

    def unmatched(request: web.Request) -> web.Response:
        """Routing errors as JSON bodies: 405 with Allow for a route's path, else 404."""
        if request.path in ROUTES:
            return _json(405, error_body(405), {"Allow": _ALLOWED[request.path]})
        return _json(404, error_body(404))

    routes = {"/records": list_records, "/healthz": healthz, "/openapi.json": openapi_json}
    for route, respond in routes.items():
        app.router.add_get(route, _serving(respond, route, durations))
    app.router.add_post("/records", _serving_awaited(create_records, "/records", durations))
    unmatched_resource = _AnyPath()
    app.router.register_resource(unmatched_resource)
    unmatched_resource.add_route("*", _serving(unmatched, None, durations))
    return app


async def _serve(context: WorkerContext, metrics: MetricBatch | None) -> None:
    settings = context.settings
    health = Health()
    runner = web.AppRunner(
        build_app(context.records, health, settings, metrics),
        access_log=None,  # a log line per request would cost more than the request
        auto_decompress=False,  # an encoded body is refused (Uploads.refused_encoding), never inflated
        keepalive_timeout=KEEP_ALIVE_TIMEOUT_SECONDS,
        shutdown_timeout=settings.shutdown_grace_seconds,
    )
    await runner.setup()
    ssl_context = server_ssl_context(settings, ["http/1.1"])
    if ssl_context is not None and metrics is not None:
        count_handshakes(ssl_context)  # uvloop's SSL protocol makes its SSLObjects with wrap_bio
        metrics.tls_handshakes()
    site = web.TCPSite(
        runner,
        settings.host,
        context.port,
        ssl_context=ssl_context,
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
