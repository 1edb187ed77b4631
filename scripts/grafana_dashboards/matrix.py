"""The dashboard of every scenario of a run side by side: client throughput and latency (InfluxDB),
server work (Prometheus)."""

from grafana_dashboards.dashboard import dashboard, influx_variables
from grafana_dashboards.panels import Panel, bargauge, hide_columns, row, table, timeseries, unit_override
from grafana_dashboards.queries import (
    Json,
    clock_buckets,
    clock_per_scenario,
    influx,
    influx_per_scenario,
    influx_throughput,
    per_second,
    percentile_columns,
    prom,
    prom_rate,
    prom_selector,
)


def matrix() -> Json:
    return dashboard(
        "protolab-matrix",
        "protolab / matrix comparison",
        "Every scenario of a run side by side: client throughput and latency, server work.",
        influx_variables("protolab_reqs"),
        [*_side_by_side(), *_over_time(), *_server_side()],
    )


def _scenarios_table() -> Panel:
    return table(
        "Scenarios",
        "One row per scenario of the run. req/s: successful requests over the time from the first "
        "to the last one; requests and failures from the uniform protolab_* metrics; latency on "
        "the lab's clock (k6's own timer of each undecoded request, as in the results).",
        [
            influx(influx_throughput(), table=True),
            influx(influx_per_scenario('sum("value") AS "requests"', "protolab_reqs"), table=True),
            influx(clock_per_scenario(f'{percentile_columns()}, max("value") AS "max"'), table=True),
            influx(influx_per_scenario('mean("value") AS "failed"', "protolab_req_failed"), table=True),
        ],
        # One table per query, joined on the scenario columns.
        transformations=[{"id": "merge", "options": {}}, hide_columns("Time")],
        overrides=[
            unit_override("^req/s$", "reqps"),
            unit_override("^(p\\d+|max)$", "ms"),
            unit_override("^failed$", "percentunit"),
        ],
    )


def _side_by_side() -> list[Panel]:
    return [
        row("Scenarios side by side (k6)"),
        _scenarios_table(),
        bargauge(
            "Throughput per scenario",
            "Successful requests per second (see the table).",
            influx(influx_throughput(), table=True),
            "reqps",
        ),
        bargauge(
            "p99 latency per scenario",
            "99th percentile of each scenario's latency on the lab's clock.",
            influx(clock_per_scenario('percentile("value", 99) AS "p99"'), table=True),
            "ms",
        ),
    ]


def _over_time() -> list[Panel]:
    return [
        row("Over time"),
        timeseries(
            "Client requests/s",
            "Successful requests per second as k6 saw them; the annotations mark each scenario.",
            [per_second("protolab_reqs", "$tag_scenario")],
            "reqps",
        ),
        timeseries(
            "Client p99 latency",
            "99th percentile per bucket, on the lab's clock.",
            [influx(clock_buckets('percentile("value", 99)'), "$tag_scenario")],
            "ms",
        ),
    ]


def _server_side() -> list[Panel]:
    peak_memory = prom_selector("protolab_cgroup_memory_peak_bytes")
    return [
        row("Server side (Prometheus)"),
        timeseries(
            "Server requests/s",
            "Requests the services handled per second: HTTP requests, or completed gRPC calls and streams.",
            [
                prom(
                    f"{prom_rate('http_server_request_duration_seconds_count', 'scenario, target')}"
                    f" or {prom_rate('grpc_server_handled_total', 'scenario, target')}",
                    "{{scenario}}",
                )
            ],
            "reqps",
            8,
        ),
        timeseries(
            "Server CPU",
            "Cores each scenario's service used.",
            [prom(prom_rate("protolab_cgroup_cpu_usage_seconds_total", "scenario"), "{{scenario}}")],
            "short",
            8,
        ),
        bargauge(
            "Peak memory per scenario",
            "Highest memory use of each scenario's service.",
            prom(
                f"max by (scenario) (max_over_time({peak_memory}[$__range]))",
                instant=True,
                table=True,
            ),
            "bytes",
            8,
        ),
    ]
