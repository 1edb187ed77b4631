"""The datasources the dashboards read, and the targets and query text of their panels."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]


@dataclass(frozen=True)
class Datasource:
    """A provisioned datasource and the input a hand import asks for instead of it."""

    type: str
    uid: str
    name: str
    input: str

    def ref(self) -> Json:
        return {"type": self.type, "uid": self.uid}


PROMETHEUS = Datasource("prometheus", "protolab-prometheus", "Prometheus", "DS_PROMETHEUS")
INFLUXDB = Datasource("influxdb", "protolab-influxdb", "InfluxDB", "DS_INFLUXDB")
DATASOURCES = (PROMETHEUS, INFLUXDB)

# Run-specific filters. `run` is single-valued; target, profile, connections (the connection model,
# "10x1"), churn ("never", or the calls a connection carries), compression ("identity", "gzip") and
# scenario are multi-valued with "All", which Grafana expands to a regex of the listed values (escaped);
# the "All" of connections, churn and compression is ".*", which matches a series without the label.
INFLUX_FILTER = (
    '"run" =~ /^$run$/ AND "target" =~ /^$target$/ AND "profile" =~ /^$profile$/'
    ' AND "connections" =~ /^$connections$/ AND "churn" =~ /^$churn$/ AND "compression" =~ /^$compression$/'
    ' AND "scenario" =~ /^$scenario$/'
)
PROM_FILTER = (
    'run="$run", target=~"$target", profile=~"$profile", connections=~"$connections", churn=~"$churn", '
    'compression=~"$compression", scenario=~"$scenario"'
)
SCENARIO_TAGS = ("scenario", "target", "profile")
# The lab's latency clock, as the runner reads it (k6/lib/common.js summaryHandler): k6's own timer
# of each undecoded request, http_req_duration for REST (successful ones), grpc_req_duration for gRPC.
CLOCK_FROM = '"http_req_duration", "grpc_req_duration"'
CLOCK_FILTER = "\"decoded\" = 'no' AND \"expected_response\" != 'false'"
# k6 writes a point per increment of a Counter (1 per request, or bytes): their sum per bucket
# divided by the bucket length is a per-second rate at any zoom level.
PER_SECOND = 'sum("value") * 1000 / $__interval_ms'
PERCENTILES = (50, 90, 95, 99)
# The quantiles the server dashboards draw from their histograms.
SERVER_QUANTILES = (0.5, 0.9, 0.99)


def influx(query: str, alias: str = "", table: bool = False) -> Json:
    """A raw InfluxQL target."""
    return {
        "datasource": INFLUXDB.ref(),
        "query": query,
        "rawQuery": True,
        "resultFormat": "table" if table else "time_series",
        "alias": alias,
    }


def prom(expr: str, legend: str = "", instant: bool = False, table: bool = False) -> Json:
    """A PromQL target; instant ones are evaluated at the end of the time range."""
    return {
        "datasource": PROMETHEUS.ref(),
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": "table" if table else "time_series",
        "editorMode": "code",
    }


def influx_buckets(select: str, measurement: str, by: Iterable[str] = ("scenario",)) -> str:
    """InfluxQL over $__interval buckets of the selected scenarios, one series per tag combination."""
    group = "".join(f', "{tag}"' for tag in by)
    return (
        f'SELECT {select} FROM "{measurement}" WHERE $timeFilter AND {INFLUX_FILTER}'
        f" GROUP BY time($__interval){group} fill(null)"
    )


def influx_per_scenario(select: str, measurement: str) -> str:
    """InfluxQL over the whole time range, one row per scenario."""
    group = ", ".join(f'"{tag}"' for tag in SCENARIO_TAGS)
    return f'SELECT {select} FROM "{measurement}" WHERE $timeFilter AND {INFLUX_FILTER} GROUP BY {group}'


def clock_buckets(select: str) -> str:
    """influx_buckets over the latency clock: each scenario's series comes from its protocol's metric."""
    return (
        f"SELECT {select} FROM {CLOCK_FROM} WHERE $timeFilter AND {INFLUX_FILTER} AND {CLOCK_FILTER}"
        ' GROUP BY time($__interval), "scenario" fill(null)'
    )


def clock_per_scenario(select: str) -> str:
    """influx_per_scenario over the latency clock."""
    group = ", ".join(f'"{tag}"' for tag in SCENARIO_TAGS)
    return (
        f"SELECT {select} FROM {CLOCK_FROM} WHERE $timeFilter AND {INFLUX_FILTER} AND {CLOCK_FILTER}"
        f" GROUP BY {group}"
    )


def influx_throughput() -> str:
    """Successful requests per second of each scenario: (points - 1) / (last - first point time).

    Exact for any scenario length, unlike a mean of per-second buckets whose first and last
    buckets are only partly filled.
    """
    group = ", ".join(f'"{tag}"' for tag in SCENARIO_TAGS)
    inner = (
        'SELECT elapsed("value", 1ns) AS "gap_ns" FROM "protolab_reqs"'
        f" WHERE $timeFilter AND {INFLUX_FILTER} GROUP BY {group}"
    )
    rate = 'count("gap_ns") * 1000000000 / sum("gap_ns") AS "req/s"'
    return f"SELECT {rate} FROM ({inner}) WHERE $timeFilter GROUP BY {group}"


def percentile_columns(percentiles: Iterable[int] = PERCENTILES) -> str:
    return ", ".join(f'percentile("value", {p}) AS "p{p}"' for p in percentiles)


def prom_selector(metric: str, extra: str = "") -> str:
    return f"{metric}{{{PROM_FILTER}{', ' + extra if extra else ''}}}"


def prom_rate(metric: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({prom_selector(metric, extra)}[$__rate_interval]))"


def prom_quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, {prom_rate(f'{histogram}_bucket', f'le, {by}')})"


def prom_quantiles(histogram: str, by: str, legend: str) -> list[Json]:
    """One target per SERVER_QUANTILES of a histogram, each legend prefixed by its pNN."""
    return [prom(prom_quantile(q, histogram, by), f"p{round(q * 100)} {legend}") for q in SERVER_QUANTILES]


def prom_max(metric: str) -> str:
    """The largest value of a metric per scenario (a gauge of the service's cgroup or process)."""
    return f"max by (scenario) ({prom_selector(metric)})"


def per_second(measurement: str, alias: str, by: Iterable[str] = ("scenario",)) -> Json:
    """A k6 Counter's increments per second (PER_SECOND), one series per tag combination."""
    return influx(influx_buckets(PER_SECOND, measurement, by), alias)
