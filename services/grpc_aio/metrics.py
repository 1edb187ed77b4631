"""go-grpc-prometheus metrics for a grpc.aio servicer (py-grpc-prometheus has no aio support).

The metrics are services.common.grpc_metrics'. Only the servicer given to
instrument_servicer is instrumented (here RecordService): health and reflection are
control traffic, and a health Watch stream lasts as long as its client.

The servicer's methods are wrapped before registration rather than by a grpc.aio
ServerInterceptor: with any interceptor, grpc.aio resolves every call's handler through
a chain of coroutines, which costs more than the metrics themselves (measured:
docs/services.md, Metrics).

Calls rejected before the handler runs are not counted: undecodable requests (as in
go-grpc-prometheus), which k6 counts. RESOURCE_EXHAUSTED from GRPC_MAX_CONCURRENT_RPCS
comes from the handler, so it is counted like any other code.
"""

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor

from services.common.grpc_metrics import GrpcServerMetrics, MethodMetrics, ended_status
from services.common.metrics import MetricBatch

UnaryBehavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncGenerator[Any, None]]


def _error_code(context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> grpc.StatusCode:
    """The status grpc.aio sends for an RPC that ended with error."""
    if isinstance(error, grpc.aio.AbortError):
        return context.code()  # abort() stores its code before raising
    if isinstance(error, asyncio.CancelledError | grpc.aio.InternalError):
        # The call ended under the handler: grpc.aio cancels the handler task both when the client
        # cancels and at the deadline, and a write already waiting fails with InternalError
        # (ExecuteBatchError) instead when the call ends first.
        return grpc.StatusCode[ended_status(context.time_remaining())]
    code = context.code()  # grpc.aio sends a code set before the exception, else UNKNOWN
    return grpc.StatusCode.UNKNOWN if code in (None, grpc.StatusCode.OK) else code


def _instrument_unary(behavior: UnaryBehavior, metrics: MethodMetrics) -> UnaryBehavior:
    async def instrumented(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started_at = time.perf_counter()
        metrics.started.inc()
        metrics.msg_received.inc()
        try:
            response = await behavior(request, context)
        except BaseException as error:
            metrics.finish(_error_code(context, error).name, started_at)
            raise
        code = context.code()
        if code is None or code is grpc.StatusCode.OK:
            metrics.msg_sent.inc()
            metrics.finish("OK", started_at)
        else:
            metrics.finish(code.name, started_at)
        return response

    return instrumented


def _instrument_server_stream(
    behavior: StreamBehavior, metrics: MethodMetrics
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]:
    # The wrapper writes with context.write rather than being an async generator itself:
    # grpc.aio then cancels *this* coroutine on client cancellation (a generator would be
    # left suspended at its yield), and each message counts once its write completed.
    async def instrumented(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        started_at = time.perf_counter()
        metrics.started.inc()
        metrics.msg_received.inc()
        try:
            async with aclosing(behavior(request, context)) as messages:
                async for message in messages:
                    await context.write(message)
                    metrics.msg_sent.inc()
        except BaseException as error:
            metrics.finish(_error_code(context, error).name, started_at)
            raise
        metrics.finish((context.code() or grpc.StatusCode.OK).name, started_at)

    return instrumented


def instrument_servicer(servicer: object, service: ServiceDescriptor, batch: MetricBatch) -> SimpleNamespace:
    """The servicer's methods of `service`, each recording its metrics into batch, as one object
    for the generated add_<Service>Servicer_to_server.

    Handles unary and server-streaming methods (server-streaming ones must be async
    generators); a service with client-streaming methods is refused.
    """
    metrics = GrpcServerMetrics()
    methods = {}
    for method in service.methods:
        if method.client_streaming:
            raise ValueError(f"{method.full_name}: client-streaming methods are not instrumented")
        behavior = getattr(servicer, method.name)
        grpc_type = "server_stream" if method.server_streaming else "unary"
        method_metrics = MethodMetrics(metrics, batch, (grpc_type, service.full_name, method.name))
        if not method.server_streaming:
            methods[method.name] = _instrument_unary(behavior, method_metrics)
        elif inspect.isasyncgenfunction(behavior):
            methods[method.name] = _instrument_server_stream(behavior, method_metrics)
        else:
            raise TypeError(f"{behavior!r} must be an async generator to be instrumented")
    return SimpleNamespace(**methods)
