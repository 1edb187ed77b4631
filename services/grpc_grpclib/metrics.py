"""go-grpc-prometheus metrics (services.common.grpc_metrics) for grpclib servicers.

A servicer's handlers are wrapped in its __mapping__, as grpc_aio wraps its servicer's
methods: grpclib's event hooks would build an event object per message. Each handler sees
its stream through a proxy that counts the messages received and sent. grpclib decodes the
request inside the handler, so an undecodable or oversized request counts as a started call
handled with the code servicer.Codec or wire.recv_message gives it (grpc.aio rejects oversized ones
before the handler, and does not count them).
"""

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from grpclib.const import Cardinality, Handler
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from services.common.grpc_metrics import GrpcServerMetrics, MethodMetrics, ended_status
from services.common.metrics import MetricBatch

# go-grpc-prometheus's grpc_type label of each cardinality.
_GRPC_TYPES = {
    Cardinality.UNARY_UNARY: "unary",
    Cardinality.UNARY_STREAM: "server_stream",
    Cardinality.STREAM_UNARY: "client_stream",
    Cardinality.STREAM_STREAM: "bidi_stream",
}


class CountedStream:
    """The part of a grpclib Stream the servicers use, counting the messages that pass."""

    __slots__ = ("_metrics", "_stream")

    def __init__(self, stream: Stream[Any, Any], metrics: MethodMetrics) -> None:
        self._stream = stream
        self._metrics = metrics

    async def recv_message(self) -> Any:
        message = await self._stream.recv_message()
        if message is not None:
            self._metrics.msg_received.inc()
        return message

    async def send_message(self, message: Any) -> None:
        await self._stream.send_message(message)
        self._metrics.msg_sent.inc()


def _ended_status(stream: Stream[Any, Any]) -> str:
    """grpclib cancels the handler both when the client cancels and at the deadline."""
    return ended_status(None if stream.deadline is None else stream.deadline.time_remaining())


def _instrument(handler: Handler, metrics: MethodMetrics) -> Handler:
    behavior = handler.func

    async def instrumented(stream: Stream[Any, Any]) -> None:
        started_at = time.perf_counter()
        metrics.started.inc()
        try:
            await behavior(CountedStream(stream, metrics))
        except GRPCError as error:
            metrics.finish(error.status.name, started_at)
            raise
        except asyncio.CancelledError:
            metrics.finish(_ended_status(stream), started_at)
            raise
        except Exception:  # grpclib answers it with UNKNOWN
            metrics.finish("UNKNOWN", started_at)
            raise
        metrics.finish("OK", started_at)

    return handler._replace(func=instrumented)


class InstrumentedServicer:
    """A servicer (anything with __mapping__) whose handlers record their metrics into batch."""

    def __init__(self, servicer: Any, batch: MetricBatch) -> None:
        metrics = GrpcServerMetrics()
        self._mapping = {}
        for path, handler in servicer.__mapping__().items():
            service, method = path.strip("/").split("/")
            labels = (_GRPC_TYPES[handler.cardinality], service, method)
            self._mapping[path] = _instrument(handler, MethodMetrics(metrics, batch, labels))

    def __mapping__(self) -> Mapping[str, Handler]:
        return self._mapping
