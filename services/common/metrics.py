"""Prometheus metrics shared by the services: the HTTP histogram, cgroup resources, build info.

Workers record into prometheus_client's multiprocess files; the supervisor process
serves them merged, with the cgroup and build-info collectors, on METRICS_PORT. The
supervisor does no request work, so scrapes stay prompt while the workers are saturated.
"""

import platform
from collections.abc import Iterable
from importlib.metadata import version

from google.protobuf.internal import api_implementation
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from services.common.cgroup import CgroupPaths, own_cgroup, read_stats

# OpenTelemetry's default HTTP buckets, extended below 5 ms where these services answer.
LATENCY_BUCKETS_SECONDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip


def http_request_duration() -> Histogram:
    """The OpenTelemetry HTTP server duration histogram, with its attribute names as labels."""
    return Histogram(
        "http_server_request_duration_seconds",
        "Duration of HTTP server requests.",
        ["http_request_method", "http_route", "http_response_status_code", "network_protocol_version"],
        buckets=LATENCY_BUCKETS_SECONDS,
    )


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
    MultiProcessCollector(registry)
    registry.register(CgroupCollector())
    registry.register(ServiceInfoCollector(service, server, workers))
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    return int(httpd.server_port)
