"""Prometheus metrics shared by the services: the HTTP histogram, TLS handshakes, cgroup resources,
build info.

Workers record into prometheus_client's multiprocess files; the supervisor process
serves them merged, with the cgroup and build-info collectors, on METRICS_PORT. The
supervisor does no request work, so scrapes stay prompt while the workers are saturated.

Workers batch what they record (MetricBatch): in multiprocess mode every Counter.inc, each
of the two writes of a Histogram.observe and every labels() lookup takes a lock and calls
into the mmap'd files, a cost a loaded worker pays per request (measured: docs/services.md,
Metrics). Batched, a request adds to plain Python numbers, and the files trail the requests
by at most FLUSH_SECONDS, a quarter of Prometheus' scrape interval.
"""

import asyncio
import contextlib
import logging
import platform
from bisect import bisect_left
from collections.abc import AsyncIterator, Iterable, Iterator
from importlib.metadata import version

from google.protobuf.internal import api_implementation
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from services.common.cgroup import CgroupPaths, own_cgroup, read_stats
from services.common.metrics_server import start_bounded_metrics_server
from services.common.tls import HANDSHAKES, HandshakeCounts

log = logging.getLogger("protolab.metrics")

# OpenTelemetry's default HTTP buckets, extended below 5 ms where these services answer.
LATENCY_BUCKETS_SECONDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip


FLUSH_SECONDS = 0.5
# OpenTelemetry's known HTTP methods; any other is recorded as _OTHER, so clients cannot grow the label set.
KNOWN_HTTP_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
)


class BatchedCounter:
    """One labelled Counter child's increments since the last flush."""

    __slots__ = ("_child", "pending")

    def __init__(self, child: Counter) -> None:
        self._child = child
        self.pending = 0

    def inc(self) -> None:
        self.pending += 1

    def flush(self) -> None:
        if self.pending:
            amount, self.pending = self.pending, 0
            self._child.inc(amount)


class BatchedHistogram:
    """One labelled Histogram child's bucket counts and sum since the last flush.

    prometheus_client has no public call that adds n observations at once, so flush adds to
    the child's bucket and sum values (_buckets, _sum; prometheus_client is pinned, and the
    tests compare scraped histograms with the requests made).
    """

    __slots__ = ("_bounds", "_child", "_counts", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self._bounds = child._upper_bounds  # ends with +Inf, so every duration has a bucket
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self._bounds, seconds)] += 1  # the first bound >= seconds, as observe()
        self._sum += seconds

    def flush(self) -> None:
        if not any(self._counts):
            return
        # Taken before writing, so a write that fails part-way is not added again next time.
        counts, total = self._counts, self._sum
        self._counts, self._sum = [0] * len(self._bounds), 0.0
        for bucket, count in zip(self._child._buckets, counts, strict=True):
            if count:
                bucket.inc(count)
        self._child._sum.inc(total)


class TlsHandshakes:
    """protolab_tls_handshakes_total{resumed="true"|"false"}: the server-side TLS handshakes the worker
    completed on the contexts services.common.tls.count_handshakes set up, taken from their counts at
    each flush. Both series exist, at 0, from the start: a query sees 0, not nothing.

    Batched like the requests, though a handshake is rare next to a request: a write of the files
    (a lock and the mmap'd file) from inside the SSL protocol's do_handshake would fail the
    connection if it raised (a full disk); the flush logs that and goes on.
    """

    __slots__ = ("_counts", "_full", "_resumed", "counter")

    def __init__(self, counts: HandshakeCounts = HANDSHAKES) -> None:
        self._counts = counts
        # Unregistered, as the gRPC metrics: in multiprocess mode the files are the registry.
        self.counter = Counter(
            "protolab_tls_handshakes_total",
            "Server-side TLS handshakes completed, full or resumed (a session ticket or session id).",
            ["resumed"],
            registry=None,
        )
        self._full = self.counter.labels("false")
        self._resumed = self.counter.labels("true")

    def flush(self) -> None:
        full, resumed = self._counts.take()  # taken before writing, as BatchedHistogram's counts
        if full:
            self._full.inc(full)
        if resumed:
            self._resumed.inc(resumed)


class MetricBatch:
    """A worker's batched series, written to the multiprocess files together.

    Used from the worker's event loop only (record, flush and the flushing task share its
    thread), so nothing needs a lock.
    """

    def __init__(self) -> None:
        self._series: list[BatchedCounter | BatchedHistogram | TlsHandshakes] = []

    def counter(self, child: Counter) -> BatchedCounter:
        batched = BatchedCounter(child)
        self._series.append(batched)
        return batched

    def histogram(self, child: Histogram) -> BatchedHistogram:
        batched = BatchedHistogram(child)
        self._series.append(batched)
        return batched

    def tls_handshakes(self, counts: HandshakeCounts = HANDSHAKES) -> TlsHandshakes:
        """protolab_tls_handshakes_total, written with the batch: for a server whose TLS context
        counts its handshakes (services.common.tls.count_handshakes)."""
        series = TlsHandshakes(counts)
        self._series.append(series)
        return series

    def flush(self) -> None:
        for series in self._series:
            series.flush()

    @contextlib.asynccontextmanager
    async def flushing(self) -> AsyncIterator["MetricBatch"]:
        """Flush every FLUSH_SECONDS while the block runs, and once more when it ends."""

        async def flush_periodically() -> None:
            while True:
                await asyncio.sleep(FLUSH_SECONDS)
                try:
                    self.flush()
                except OSError:  # e.g. a full disk: keep serving, and try again next time
                    log.exception("writing the metrics files failed")

        task = asyncio.create_task(flush_periodically())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.flush()


@contextlib.contextmanager
def worker_metrics(enabled: bool) -> Iterator[MetricBatch | None]:
    """A worker's batch (None when metrics are off), flushed once more after the block, where
    the worker's event loop has ended: handlers cancelled while the loop shut down record
    their calls after the last flush of flushing()."""
    batch = MetricBatch() if enabled else None
    try:
        yield batch
    finally:
        if batch is not None:
            batch.flush()


class HttpServerDurations:
    """The OpenTelemetry HTTP server duration histogram, with its attribute names as labels, batched."""

    def __init__(self, batch: MetricBatch) -> None:
        self._batch = batch
        self._histogram = Histogram(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests.",
            ["http_request_method", "http_route", "http_response_status_code", "network_protocol_version"],
            buckets=LATENCY_BUCKETS_SECONDS,
        )
        self._series: dict[tuple[str, str, int, str], BatchedHistogram] = {}

    def observe(self, method: str, route: str, status: int, version: str, seconds: float) -> None:
        """Record one response; route must already be bounded (services.common.rest.route_label)."""
        series = self._series.get((method, route, status, version))
        if series is None:
            series = self._new_series(method, route, status, version)
        series.observe(seconds)

    def _new_series(self, method: str, route: str, status: int, version: str) -> BatchedHistogram:
        """The series of a first response: under _OTHER for an unknown method, whose key is not kept
        (clients cannot grow the dict), so each of its responses comes here."""
        known = method if method in KNOWN_HTTP_METHODS else "_OTHER"
        key = (known, route, status, version)
        series = self._series.get(key)
        if series is None:
            child = self._histogram.labels(known, route, str(status), version)
            series = self._series[key] = self._batch.histogram(child)
        return series


class CgroupCollector(Collector):
    """The service's resources as its cgroup reports them (a container's, in Docker)."""

    def __init__(self, cgroup: CgroupPaths | None = None) -> None:
        self._cgroup = cgroup or own_cgroup()

    def collect(self) -> Iterable[Metric]:
        stats = read_stats(self._cgroup)
        counters = {
            "cpu_usage_seconds": (stats.cpu_usage_seconds, "CPU time used by the cgroup."),
            "cpu_periods": (stats.cpu_periods, "CFS enforcement periods elapsed."),
            "cpu_throttled_periods": (stats.cpu_throttled_periods, "Periods the quota throttled."),
            "cpu_throttled_seconds": (stats.cpu_throttled_seconds, "Time spent throttled."),
        }
        gauges = {
            "cpu_limit_cores": (stats.cpu_limit_cores, "CPU quota in cores (absent: unlimited)."),
            "memory_usage_bytes": (stats.memory_usage_bytes, "Memory in use."),
            "memory_peak_bytes": (stats.memory_peak_bytes, "Highest memory use recorded."),
            "memory_limit_bytes": (stats.memory_limit_bytes, "Memory limit (absent: unlimited)."),
        }
        for name, (value, doc) in counters.items():
            if value is not None:
                yield CounterMetricFamily(f"protolab_cgroup_{name}", doc, value=value)
        for name, (value, doc) in gauges.items():
            if value is not None:
                yield GaugeMetricFamily(f"protolab_cgroup_{name}", doc, value=value)


class ServiceInfoCollector(Collector):
    """Worker count and build info: what ran, for the dashboards and the report."""

    def __init__(self, service: str, server: str, workers: int) -> None:
        self._workers = workers
        self._info = {
            "implementation": service,  # not "service": the runner's target label has that name
            "server": server,
            "server_version": version(server),
            "python": platform.python_version(),
            "grpcio": version("grpcio"),
            "protobuf": version("protobuf"),
            "protobuf_backend": api_implementation.Type(),
        }

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("protolab_workers", "Worker processes serving.", value=self._workers)
        yield InfoMetricFamily("protolab_build", "Versions this service runs with.", value=self._info)


def start_metrics_server(host: str, port: int, service: str, server: str, workers: int) -> int:
    """Serve /metrics from the supervisor process; returns the bound port (port 0 picks one)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    registry.register(CgroupCollector())
    registry.register(ServiceInfoCollector(service, server, workers))
    return start_bounded_metrics_server(host, port, registry)
