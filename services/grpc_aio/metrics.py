"""go-grpc-prometheus metrics for a grpc.aio servicer (py-grpc-prometheus has no aio support).

The metrics are services.common.grpc_metrics'. Only the servicer given to
instrument_servicer is instrumented (here RecordService): health and reflection are
control traffic, and a health Watch stream lasts as long as its client.

The servicer's methods are wrapped before registration rather than by a grpc.aio
ServerInterceptor: with any interceptor, grpc.aio resolves every call's handler through
a chain of coroutines, which costs more than the metrics themselves (measured:
docs/services.md, Metrics).

Calls rejected before the handler runs are not counted: requests over
grpc.max_receive_message_length, which k6 counts. No RecordService deserializer raises
(server.add_record_service), so undecodable requests reach the handler and count as InvalidArgument.
RESOURCE_EXHAUSTED from GRPC_MAX_CONCURRENT_RPCS comes from the handler, so it is counted
like any other code. A client stream's messages count as the handler reads them. A client
stream that grpc core ends at a message over grpc.max_receive_message_length ends the handler's
iteration as the client's last message would (grpc.aio's read() cannot tell the two apart), so it
counts as OK, or Canceled, where the client gets RESOURCE_EXHAUSTED.
"""

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor

from services.common.grpc_metrics import GrpcServerMetrics, MethodMetrics, ended_status
from services.common.metrics import BatchedCounter, MetricBatch

# go-grpc-prometheus's grpc_type label by (client streaming, server streaming).
_GRPC_TYPES = {(False, False): "unary", (False, True): "server_stream", (True, False): "client_stream"}
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


def _finish_unary_response(
    context: grpc.aio.ServicerContext[Any, Any], metrics: MethodMetrics, started_at: float
) -> None:
    """Count a call whose handler returned its one response (sent unless it set another code)."""
    code = context.code()
    if code is None or code is grpc.StatusCode.OK:
        metrics.msg_sent.inc()
        metrics.finish("OK", started_at)
    else:
        metrics.finish(code.name, started_at)


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
        _finish_unary_response(context, metrics, started_at)
        return response

    return instrumented


async def _counted(messages: AsyncIterator[Any], received: BatchedCounter) -> AsyncIterator[Any]:
    """The messages of a client stream, each counted as the handler reads it."""
    async for message in messages:
        received.inc()
        yield message


def _instrument_client_stream(behavior: UnaryBehavior, metrics: MethodMetrics) -> UnaryBehavior:
    async def instrumented(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started_at = time.perf_counter()
        metrics.started.inc()
        try:
            response = await behavior(_counted(requests, metrics.msg_received), context)
        except BaseException as error:
            metrics.finish(_error_code(context, error).name, started_at)
            raise
        _finish_unary_response(context, metrics, started_at)
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
    for an add_<Service>Servicer_to_server (server.add_record_service for RecordService).

    Handles unary, server-streaming (which must be async generators) and client-streaming methods;
    a service with bidirectional methods is refused.
    """
    metrics = GrpcServerMetrics()
    methods = {}
    for method in service.methods:
        if method.client_streaming and method.server_streaming:
            raise ValueError(
                f"{method.full_name}: a client-streaming method with a streamed response is not instrumented"
            )
        behavior = getattr(servicer, method.name)
        grpc_type = _GRPC_TYPES[method.client_streaming, method.server_streaming]
        method_metrics = MethodMetrics(metrics, batch, (grpc_type, service.full_name, method.name))
        if method.client_streaming:
            methods[method.name] = _instrument_client_stream(behavior, method_metrics)
        elif not method.server_streaming:
            methods[method.name] = _instrument_unary(behavior, method_metrics)
        elif inspect.isasyncgenfunction(behavior):
            methods[method.name] = _instrument_server_stream(behavior, method_metrics)
        else:
            raise TypeError(f"{behavior!r} must be an async generator to be instrumented")
    return SimpleNamespace(**methods)
