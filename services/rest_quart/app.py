"""The Quart application: build_app, the REST API any ASGI server can run (Hypercorn here, Granian in
services.rest_granian), and create_app, what each Hypercorn worker calls
(services.rest_quart.app:create_app())."""

import asyncio
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import orjson
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable, ASGISendEvent, Scope
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from services.common import heap, hypercorn_limits
from services.common.config import Settings, load_settings
from services.common.metrics import HttpServerDurations, MetricBatch
from services.common.records import BadRequest, RecordSource
from services.common.rest import (
    JSON,
    Health,
    RecordBodies,
    ResponseEncoding,
    Uploads,
    error_body,
    openapi_document,
    route_label,
)
from services.common.shapes import shape_kit
from services.common.supervisor import record_source, signal_when_parent_dies
from services.rest_quart import DRAIN_FLAG, READY_PREFIX, runtime_dir

log = logging.getLogger("protolab.rest_quart")

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status=status, headers=headers, content_type=JSON)


def _timed(asgi_app: ASGIApp, durations: HttpServerDurations) -> ASGIApp:
    """The app timed at the ASGI boundary, one observation per HTTP request, from its call until the
    response is sent. Quart's before/after-request hooks did the same at 4-6% of a request's CPU
    (benchmarks/side_by_side.py, metrics on against off); this wraps only send, to read the status.
    Every route is a fixed path, so the path gives the http_route label (route_label)."""

    async def timed(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None  # stays None when the client left before a response started

        async def send_reading_status(message: ASGISendEvent) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await asgi_app(scope, receive, send_reading_status)
        if status is not None:
            elapsed = time.perf_counter() - started
            route = route_label(None, scope["path"])
            durations.observe(scope["method"], route, status, scope["http_version"], elapsed)

    return timed


def _responses_after_request_bodies(asgi_app: ASGIApp) -> ASGIApp:
    """The app, with an HTTP/2 request's response ending only once its request body has.

    Hypercorn 0.18 drops the whole HTTP/2 connection when body frames arrive after the response
    closed their stream (pgjones/hypercorn#329), so a 413, answered as soon as the body is known to
    be too large, would take every other stream on the connection with it. Quart keeps receiving
    (and drops) what is past MAX_CONTENT_LENGTH, so the wait ends with the client's last frame.
    GET and HEAD pass straight through: receive_whole_request (build_app) reads their bodies first.
    """

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http" or scope["http_version"] != "2" or scope["method"] in {"GET", "HEAD"}:
            await asgi_app(scope, receive, send)
            return
        body_ended = asyncio.Event()

        async def receive_noting_the_end() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_ended.set()
            return message

        async def send_after_the_body(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await body_ended.wait()
            await send(message)

        await asgi_app(scope, receive_noting_the_end, send_after_the_body)

    return app


def build_app(
    settings: Settings, records: RecordSource, health: Health, *, tls_handshakes: bool = False
) -> Quart:
    """The REST API as a Quart app: routes, JSON errors and, when enabled, request metrics (flushed
    while the ASGI lifespan runs); with tls_handshakes, protolab_tls_handshakes_total too, for a
    server whose TLS context counts them (Hypercorn's: services.rest_quart.server; Granian's TLS is
    not Python's). The server decides when health reports draining."""
    openapi = orjson.dumps(
        openapi_document(settings.max_count, settings.default_count, settings.max_request_bytes)
    )
    shape = shape_kit(settings.shape)  # the record shape, for the process's life (SHAPE)
    bodies = RecordBodies(records, settings.response_model, shape)
    encoding = ResponseEncoding(settings.compression)
    uploads = Uploads(settings.max_count, settings.max_request_bytes, shape)

    app = Quart(__name__)
    # OPTIONS answers 405 as on aiohttp, and as the OpenAPI document (no OPTIONS) says.
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    # Reading a body over it raises RequestEntityTooLarge (413), on Hypercorn and Granian alike.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes

    @app.before_request
    async def receive_whole_request() -> None:
        # Hypercorn 0.18 drops the whole HTTP/2 connection when request body frames arrive
        # after the response closed their stream (pgjones/hypercorn#329): a POST answered 405
        # would take every other stream on the connection with it. Reading the body first
        # avoids that; a request without a body (every GET of a load test) is complete already.
        if request.http_version == "2":
            await request.get_data()

    @app.get("/records")
    async def list_records() -> Response:
        try:
            body = bodies.body(request.args.get("count"), request.args.get("offset"))
        except BadRequest as error:
            return _json(400, error_body(400, str(error)))
        return _json(200, *encoding.encode(body, request.headers.get("Accept-Encoding")))

    @app.post("/records")
    async def create_records() -> Response:
        refused = uploads.refused_encoding(request.headers.get("Content-Encoding"))
        if refused is not None:
            return _json(*refused)
        # Over MAX_CONTENT_LENGTH: RequestEntityTooLarge, answered by http_error.
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        status, reply = uploads.answer(request.headers.get("Content-Type"), body)
        return _json(status, reply)

    @app.get("/healthz")
    async def healthz() -> Response:
        status, body = health.response()
        return _json(status, body)

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return _json(200, openapi)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status == 413:  # a body over MAX_CONTENT_LENGTH, in the lab's words
            # The rest of an HTTP/1.1 body is left unread, so the connection cannot carry another
            # request reliably (Granian then dropped or stalled the next one): it closes, as a 413
            # may. HTTP/2 has no Connection header, and its other streams are unaffected.
            closing = None if request.http_version == "2" else {"Connection": "close"}
            return _json(status, uploads.too_large, closing)
        allow = dict(error.get_headers()).get("Allow")
        return _json(status, error_body(status), {"Allow": allow} if allow else None)

    @app.errorhandler(Exception)
    async def unexpected_error(_error: Exception) -> Response:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return _json(500, error_body(500))

    app.asgi_app = _responses_after_request_bodies(app.asgi_app)  # type: ignore[method-assign,assignment]
    if settings.metrics_enabled:
        metrics = MetricBatch()
        durations = HttpServerDurations(metrics)
        if tls_handshakes:
            metrics.tls_handshakes()

        @app.while_serving
        async def flush_metrics() -> AsyncGenerator[None, None]:
            # Hypercorn ends serving (lifespan shutdown) after the last request, so none is lost.
            async with metrics.flushing():
                yield

        app.asgi_app = _timed(app.asgi_app, durations)  # type: ignore[method-assign,assignment]

    return app


def create_app() -> Quart:
    """A Hypercorn worker's app, configured from the environment (the record pool is loaded here):
    build_app, with the drain flag the supervising process creates and the worker's start-up rules."""
    settings = load_settings("rest_quart")
    hypercorn_limits.install()
    if settings.http3:  # aioquic imported only for HTTP/3, as Hypercorn does
        from services.common import quic_limits  # noqa: PLC0415

        quic_limits.install()
    app = build_app(
        settings,
        record_source(settings),
        Health(flag_file=runtime_dir() / DRAIN_FLAG),
        tls_handshakes=settings.tls,  # counted by Hypercorn's context (HandshakeCountingConfig)
    )

    @app.before_serving
    async def started() -> None:
        # Hypercorn's supervisor terminates the other workers as soon as the first one has
        # shut down, cutting their in-flight requests; its shutdown event stops a worker
        # gracefully, so SIGTERM must not.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # A supervisor killed outright cannot stop its workers: the kernel does, so none
        # outlives it holding the port.
        supervisor = multiprocessing.parent_process()
        if (
            supervisor is None
            or supervisor.pid is None
            or not signal_when_parent_dies(signal.SIGKILL, supervisor.pid)
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        heap.freeze_startup(settings.gc_freeze)
        (runtime_dir() / f"{READY_PREFIX}{os.getpid()}").touch()

    return app
