"""A grpc.aio server interceptor recording the go-grpc-prometheus metrics (py-grpc-prometheus has no aio).

Names, labels and label values follow go-grpc-prometheus exactly (grpc_code in Go's
spelling: "OK", "InvalidArgument", "Canceled"), so existing gRPC dashboards work. Only
the services it is given are instrumented (here RecordService): health and reflection
are control traffic, and a health Watch stream lasts as long as its client. Every series
of an instrumented method exists from start-up at 0, so rate() sees the first request.
Workers write multiprocess files; the supervisor serves them (services.common.metrics).

Calls rejected before the handler runs are not counted: undecodable requests (as in
go-grpc-prometheus), which k6 counts. RESOURCE_EXHAUSTED from GRPC_MAX_CONCURRENT_RPCS
comes from the handler, so it is counted like any other code.
"""

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Any

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor
from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS_SECONDS

_LABELS = ("grpc_type", "grpc_service", "grpc_method")
# Go's codes.Code.String() is the CamelCase of the enum name, except these two.
_GO_CODE_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}

UnaryBehavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


def go_code_name(code: grpc.StatusCode) -> str:
    """The grpc_code label value go-grpc-prometheus writes for a status code."""
    return _GO_CODE_NAMES.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


class _Metrics:
    """The five go-grpc-prometheus metrics, unregistered: in multiprocess mode the files are the registry."""

    def __init__(self) -> None:
        self.started = Counter(
            "grpc_server_started_total", "Total number of RPCs started on the server.", _LABELS, registry=None
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            (*_LABELS, "grpc_code"),
            registry=None,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the"
            " server.",
            _LABELS,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=None,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
            _LABELS,
            registry=None,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
            _LABELS,
            registry=None,
        )


class _MethodMetrics:
    """One method's series, bound once so the hot path does no label lookups."""

    __slots__ = ("handled", "handling_seconds", "msg_received", "msg_sent", "started")

    def __init__(self, metrics: _Metrics, grpc_type: str, service: str, method: str) -> None:
        labels = (grpc_type, service, method)
        self.started = metrics.started.labels(*labels)
        self.handling_seconds = metrics.handling_seconds.labels(*labels)
        self.msg_received = metrics.msg_received.labels(*labels)
        self.msg_sent = metrics.msg_sent.labels(*labels)
        self.handled = {code: metrics.handled.labels(*labels, go_code_name(code)) for code in grpc.StatusCode}

    def finish(self, code: grpc.StatusCode, started_at: float) -> None:
        self.handled[code].inc()
        self.handling_seconds.observe(time.perf_counter() - started_at)


def _error_code(context: grpc.aio.ServicerContext, error: BaseException) -> grpc.StatusCode:
    """The status grpc.aio sends for an RPC that ended with error."""
    if isinstance(error, grpc.aio.AbortError):
        return context.code()  # abort() stores its code before raising
    if isinstance(error, asyncio.CancelledError):
        # grpc.aio cancels the handler task both when the client cancels and at the deadline.
        remaining = context.time_remaining()
        return grpc.StatusCode.DEADLINE_EXCEEDED if remaining == 0 else grpc.StatusCode.CANCELLED
    code = context.code()  # grpc.aio sends a code set before the exception, else UNKNOWN
    return grpc.StatusCode.UNKNOWN if code in (None, grpc.StatusCode.OK) else code


def _instrument_unary(behavior: UnaryBehavior, metrics: _MethodMetrics) -> UnaryBehavior:
    async def instrumented(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started_at = time.perf_counter()
        metrics.started.inc()
        metrics.msg_received.inc()
        try:
            response = await behavior(request, context)
        except BaseException as error:
            metrics.finish(_error_code(context, error), started_at)
            raise
        code = context.code() or grpc.StatusCode.OK
        if code is grpc.StatusCode.OK:
            metrics.msg_sent.inc()
        metrics.finish(code, started_at)
        return response

    return instrumented


def _instrument_server_stream(
    behavior: StreamBehavior, metrics: _MethodMetrics
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    # The wrapper writes with context.write rather than being an async generator itself:
    # grpc.aio then cancels *this* coroutine on client cancellation (a generator would be
    # left suspended at its yield), and each message counts once its write completed.
    async def instrumented(request: Any, context: grpc.aio.ServicerContext) -> None:
        started_at = time.perf_counter()
        metrics.started.inc()
        metrics.msg_received.inc()
        try:
            async with aclosing(behavior(request, context)) as messages:
                async for message in messages:
                    await context.write(message)
                    metrics.msg_sent.inc()
        except BaseException as error:
            metrics.finish(_error_code(context, error), started_at)
            raise
        metrics.finish(context.code() or grpc.StatusCode.OK, started_at)

    return instrumented


class GrpcServerMetrics(grpc.aio.ServerInterceptor):
    """Records started, handled (by code), handling time and messages per method of the given services.

    Handles unary and server-streaming methods (server-streaming handlers must be async
    generators); a service with client-streaming methods is refused when constructed.
    """

    def __init__(self, services: Iterable[ServiceDescriptor]) -> None:
        metrics = _Metrics()
        self._metrics: dict[str, _MethodMetrics] = {}
        for service in services:
            for method in service.methods:
                if method.client_streaming:
                    raise ValueError(f"{method.full_name}: client-streaming methods are not instrumented")
                grpc_type = "server_stream" if method.server_streaming else "unary"
                self._metrics[f"/{service.full_name}/{method.name}"] = _MethodMetrics(
                    metrics, grpc_type, service.full_name, method.name
                )
        # Handlers are fixed once the server starts and this is the only interceptor, so each
        # resolved method is wrapped once; unknown method names are not cached (unbounded).
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = await continuation(handler_call_details)
            if handler is not None:
                metrics = self._metrics.get(method)
                handler = handler if metrics is None else _instrument(handler, metrics)
                self._handlers[method] = handler
        return handler


def _instrument(handler: grpc.RpcMethodHandler, metrics: _MethodMetrics) -> grpc.RpcMethodHandler:
    if handler.response_streaming:
        if not inspect.isasyncgenfunction(handler.unary_stream):
            raise TypeError(f"{handler.unary_stream!r} must be an async generator to be instrumented")
        return handler._replace(unary_stream=_instrument_server_stream(handler.unary_stream, metrics))
    return handler._replace(unary_unary=_instrument_unary(handler.unary_unary, metrics))
