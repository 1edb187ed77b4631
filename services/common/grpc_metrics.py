"""go-grpc-prometheus's server metrics, shared by the gRPC servers (grpc.aio and grpclib).

Names, labels and label values follow go-grpc-prometheus exactly (grpc_code in Go's
spelling: "OK", "InvalidArgument", "Canceled"), so existing gRPC dashboards work. Status
codes are passed by their name ("INVALID_ARGUMENT"), which grpcio's grpc.StatusCode and
grpclib's Status spell alike. Every series of a method exists from start-up at 0, so
rate() sees the first request. Counts are batched into the worker's multiprocess files
(services.common.metrics.MetricBatch); the supervisor serves them.
"""

import time

from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS_SECONDS, MetricBatch

LABELS = ("grpc_type", "grpc_service", "grpc_method")
# The gRPC status codes by name, in code order (0-16).
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
# Go's codes.Code.String() is the CamelCase of the enum name, except these two.
_GO_CODE_NAMES = {"OK": "OK", "CANCELLED": "Canceled"}
# A client cancels its call (RST_STREAM) at its own deadline. The server's copy of the deadline starts
# when it reads the call's headers, later: milliseconds on a loopback, up to a CFS period (100 ms) when
# the server's CPU quota throttled it as they arrived. So that cancel can arrive before the server's
# deadline passes: a call ended this close to its deadline ended by the deadline.
DEADLINE_SLACK_SECONDS = 0.1


def go_code_name(status: str) -> str:
    """The grpc_code label value go-grpc-prometheus writes for a status code's name."""
    return _GO_CODE_NAMES.get(status) or "".join(part.capitalize() for part in status.split("_"))


def ended_status(time_remaining: float | None) -> str:
    """The status of a call that ended under its handler (cancelled by the client or at its deadline),
    from the seconds its deadline had left then (None: no deadline)."""
    if time_remaining is not None and time_remaining < DEADLINE_SLACK_SECONDS:
        return "DEADLINE_EXCEEDED"
    return "CANCELLED"


class GrpcServerMetrics:
    """The five go-grpc-prometheus metrics, unregistered: in multiprocess mode the files are the registry."""

    def __init__(self) -> None:
        self.started = Counter(
            "grpc_server_started_total", "Total number of RPCs started on the server.", LABELS, registry=None
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            (*LABELS, "grpc_code"),
            registry=None,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the"
            " server.",
            LABELS,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=None,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
            LABELS,
            registry=None,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
            LABELS,
            registry=None,
        )


class MethodMetrics:
    """One method's series, bound and batched once, so the hot path only adds to numbers."""

    __slots__ = ("handled", "handling_seconds", "msg_received", "msg_sent", "started")

    def __init__(self, metrics: GrpcServerMetrics, batch: MetricBatch, labels: tuple[str, str, str]) -> None:
        self.started = batch.counter(metrics.started.labels(*labels))
        self.handling_seconds = batch.histogram(metrics.handling_seconds.labels(*labels))
        self.msg_received = batch.counter(metrics.msg_received.labels(*labels))
        self.msg_sent = batch.counter(metrics.msg_sent.labels(*labels))
        self.handled = {
            status: batch.counter(metrics.handled.labels(*labels, go_code_name(status)))
            for status in STATUS_NAMES
        }

    def finish(self, status: str, started_at: float) -> None:
        """Count a call that ended with the status of this name, started at perf_counter() started_at."""
        self.handled[status].inc()
        self.handling_seconds.observe(time.perf_counter() - started_at)
