"""Generate protolab's Grafana dashboards (provisioned and hand-import variants); --check reports drift."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Provisioned by grafana/provisioning/dashboards/dashboards.yml (mounted at /var/lib/grafana/dashboards).
DASHBOARDS_DIR = REPO / "grafana" / "dashboards"
# Outside DASHBOARDS_DIR: Grafana's file provider reads its folder recursively.
IMPORT_DIR = REPO / "grafana" / "import"
# The Grafana that docker-compose.yml runs and the schemaVersion it writes for classic dashboards:
# 42, DASHBOARD_SCHEMA_VERSION in grafana/grafana public/app/features/dashboard/state/DashboardMigrator.ts
# ("the FINAL version for the v1 dashboard API"). tests/unit/test_dashboards.py fails when compose's
# Grafana changes and these do not.
SCHEMA_VERSION = 42
GRAFANA_VERSION = "12.4.3"
GRID_WIDTH = 24

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

# Run-specific filters. `run` is single-valued; target, profile and scenario are multi-valued
# with "All", which Grafana expands to a regex of the listed values (escaped).
INFLUX_FILTER = (
    '"run" =~ /^$run$/ AND "target" =~ /^$target$/ AND "profile" =~ /^$profile$/'
    ' AND "scenario" =~ /^$scenario$/'
)
PROM_FILTER = 'run="$run", target=~"$target", profile=~"$profile", scenario=~"$scenario"'
SCENARIO_TAGS = ("scenario", "target", "profile")
# The lab's latency clock, as the runner reads it (k6/lib/common.js summaryHandler): k6's own timer
# of each undecoded request, http_req_duration for REST (successful ones), grpc_req_duration for gRPC.
CLOCK_FROM = '"http_req_duration", "grpc_req_duration"'
CLOCK_FILTER = "\"decoded\" = 'no' AND \"expected_response\" != 'false'"
# k6 writes a point per increment of a Counter (1 per request, or bytes): their sum per bucket
# divided by the bucket length is a per-second rate at any zoom level.
PER_SECOND = 'sum("value") * 1000 / $__interval_ms'
PERCENTILES = (50, 90, 95, 99)
HTTP_PHASES = (
    "http_req_blocked",
    "http_req_connecting",
    "http_req_tls_handshaking",
    "http_req_sending",
    "http_req_waiting",
    "http_req_receiving",
)


# Targets -------------------------------------------------------------------------------------------


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


# Panels --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """A panel and its width; positions and ids are assigned by layout()."""

    body: Json
    width: int = 12
    height: int = 8


def _panel(kind: str, title: str, description: str, targets: list[Json], **body: Any) -> Json:
    datasources = {json.dumps(t["datasource"], sort_keys=True) for t in targets}
    if len(datasources) != 1:
        raise ValueError(f"panel {title!r}: targets must share one datasource")
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "targets": [{"refId": chr(ord("A") + i), **t} for i, t in enumerate(targets)],
        **body,
    }


def _field_config(unit: str, overrides: list[Json] | None = None, **defaults: Any) -> Json:
    return {"defaults": {"unit": unit, **defaults}, "overrides": overrides or []}


def timeseries(
    title: str, description: str, targets: list[Json], unit: str = "short", width: int = 12
) -> Panel:
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "showPoints": "never",
        "spanNulls": False,
    }
    body = _panel(
        "timeseries",
        title,
        description,
        targets,
        fieldConfig=_field_config(unit, custom=custom),
        options={
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["mean", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )
    return Panel(body, width)


def k6_data_transfer(width: int = 12) -> Panel:
    """Bytes per second k6 received and sent: the same panel on both k6 dashboards."""
    return timeseries(
        "Data transfer",
        "Bytes per second on the wire, as k6 counts them.",
        [
            influx(influx_buckets(PER_SECOND, "data_received"), "received $tag_scenario"),
            influx(influx_buckets(PER_SECOND, "data_sent"), "sent $tag_scenario"),
        ],
        "Bps",
        width,
    )


def k6_checks(width: int = 12) -> Panel:
    """The share of passed k6 checks, by check: the same panel on both k6 dashboards."""
    return timeseries(
        "Checks passed",
        "Share of passed checks, by check (1 response in CHECK_EVERY is decoded and checked).",
        [
            influx(
                influx_buckets('mean("value")', "checks", ("scenario", "check")),
                "$tag_scenario $tag_check",
            )
        ],
        "percentunit",
        width,
    )


def _reduce(values: bool = False) -> Json:
    return {"values": values, "calcs": ["lastNotNull"], "fields": ""}


def stat(title: str, description: str, targets: list[Json], unit: str = "short", width: int = 6) -> Panel:
    options = {
        "reduceOptions": _reduce(),
        "colorMode": "value",
        "graphMode": "none",
        "textMode": "value_and_name",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return Panel(
        _panel("stat", title, description, targets, fieldConfig=_field_config(unit), options=options), width
    )


def bargauge(title: str, description: str, target: Json, unit: str, width: int = 12) -> Panel:
    """One bar per row of a table with one numeric column, named by the row's text columns."""
    options = {
        "reduceOptions": _reduce(values=True),
        "orientation": "horizontal",
        "displayMode": "gradient",
        "showUnfilled": True,
        "valueMode": "color",
        "namePlacement": "auto",
    }
    body = _panel(
        "bargauge", title, description, [target], fieldConfig=_field_config(unit, min=0), options=options
    )
    return Panel(body, width)


def table(
    title: str,
    description: str,
    targets: list[Json],
    *,
    transformations: list[Json],
    overrides: list[Json] | None = None,
    width: int = 24,
    height: int = 8,
) -> Panel:
    body = _panel(
        "table",
        title,
        description,
        targets,
        fieldConfig=_field_config("short", overrides),
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}},
        transformations=transformations,
    )
    return Panel(body, width, height)


def hide_columns(*names: str) -> Json:
    return {"id": "organize", "options": {"excludeByName": dict.fromkeys(names, True)}}


def unit_override(pattern: str, unit: str) -> Json:
    return {"matcher": {"id": "byRegexp", "options": pattern}, "properties": [{"id": "unit", "value": unit}]}


def row(title: str) -> Panel:
    return Panel({"type": "row", "title": title, "collapsed": False, "panels": []}, GRID_WIDTH, 1)


def layout(panels: list[Panel]) -> list[Json]:
    """Place panels left to right in a 24-column grid, rows on a line of their own; number them."""
    placed: list[Json] = []
    x = y = line_height = 0
    for panel_id, panel in enumerate(panels, start=1):
        if x + panel.width > GRID_WIDTH or (panel.body["type"] == "row" and x):
            x, y, line_height = 0, y + line_height, 0
        placed.append(
            {"id": panel_id, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y}, **panel.body}
        )
        x += panel.width
        line_height = max(line_height, panel.height)
    return placed


# Template variables and annotations -----------------------------------------------------------------

VARIABLES = ("run", "target", "profile", "scenario")


def _variable(name: str, source: Datasource, query: str) -> Json:
    single = name == "run"
    return {
        "name": name,
        "label": name.capitalize(),
        "type": "query",
        "datasource": source.ref(),
        "query": query,
        "definition": query,
        # On time range change, so a new run shows up without a reload.
        "refresh": 2,
        "regex": "",
        # The runner's run ids start with a UTC timestamp: descending puts the latest run first,
        # which Grafana selects by default.
        "sort": 2 if single else 1,
        "multi": not single,
        "includeAll": not single,
        "current": {} if single else {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "skipUrlSync": False,
    }


def influx_variables(measurement: str) -> list[Json]:
    """run, target, profile, scenario from the tags of a k6 measurement, each narrowed by the ones before."""
    variables = []
    for i, name in enumerate(VARIABLES):
        where = " AND ".join(f'"{prev}" =~ /^${prev}$/' for prev in VARIABLES[:i])
        query = f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "{name}"' + (
            f" WHERE {where}" if where else ""
        )
        variables.append(_variable(name, INFLUXDB, query))
    return variables


def prom_variables(metric: str) -> list[Json]:
    """run, target, profile, scenario from the file_sd target labels of a metric, narrowed in order."""
    variables = []
    for i, name in enumerate(VARIABLES):
        matchers = ", ".join(
            f'{prev}="$run"' if prev == "run" else f'{prev}=~"${prev}"' for prev in VARIABLES[:i]
        )
        selector = f"{metric}{{{matchers}}}" if matchers else metric
        variables.append(_variable(name, PROMETHEUS, f"label_values({selector}, {name})"))
    return variables


# The runner writes two points per scenario into InfluxDB measurement protolab_scenario, at its
# start and at its end: tags run, scenario, target, protocol, profile; string fields event
# ("start" or "end") and text.
SCENARIO_WINDOWS = {
    "name": "Scenario windows",
    "datasource": INFLUXDB.ref(),
    "enable": True,
    "hide": False,
    "iconColor": "rgba(255, 152, 48, 1)",
    "query": (
        'SELECT "text", "event", "scenario", "target", "profile" FROM "protolab_scenario"'
        f" WHERE $timeFilter AND {INFLUX_FILTER}"
    ),
    "textColumn": "text",
    "tagsColumn": "event,scenario,target,profile",
}


def dashboard(uid: str, title: str, description: str, variables: list[Json], panels: list[Panel]) -> Json:
    return {
        "uid": uid,
        "id": None,
        "title": title,
        "description": description,
        "tags": ["protolab"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "refresh": "",
        "links": [
            {
                "type": "dashboards",
                "title": "protolab",
                "tags": ["protolab"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "annotations": {"list": [copy.deepcopy(SCENARIO_WINDOWS)]},
        "templating": {"list": variables},
        "panels": layout(panels),
    }


# Dashboards ----------------------------------------------------------------------------------------


def vus_panel(note: str) -> Panel:
    return timeseries(
        "Virtual users",
        f"k6 `vus`, sampled once a second. {note}",
        [influx(influx_buckets('max("value")', "vus"), "$tag_scenario")],
        width=8,
    )


def k6_http() -> Json:
    by_proto = ("scenario", "proto")
    phases = [
        influx(
            influx_buckets('mean("value")', phase, by_proto),
            f"{phase.removeprefix('http_req_')} $tag_scenario $tag_proto",
        )
        for phase in HTTP_PHASES
    ]
    setup = [
        influx(
            influx_buckets('max("value")', phase, by_proto),
            f"{phase.removeprefix('http_req_')} $tag_scenario $tag_proto",
        )
        for phase in HTTP_PHASES[:3]
    ]
    panels = [
        row("Load"),
        vus_panel("REST scenarios only."),
        timeseries(
            "Requests/s by protocol version",
            "Every HTTP response (`http_reqs`), per second, by negotiated protocol (`proto`).",
            [influx(influx_buckets(PER_SECOND, "http_reqs", by_proto), "$tag_scenario $tag_proto")],
            "reqps",
            8,
        ),
        timeseries(
            "Successful requests/s",
            "`protolab_reqs`: requests that passed (status 200, checks when sampled), per second. "
            "The same metric as the gRPC dashboard, so the numbers compare.",
            [influx(influx_buckets(PER_SECOND, "protolab_reqs"), "$tag_scenario")],
            "reqps",
            8,
        ),
        row("Errors"),
        timeseries(
            "Failure rate",
            "Share of failed requests: k6's `http_req_failed` (non-2xx/3xx or network error) and "
            "protolab's `protolab_req_failed` (also counts failed checks).",
            [
                influx(
                    influx_buckets('mean("value")', "http_req_failed", by_proto),
                    "http $tag_scenario $tag_proto",
                ),
                influx(influx_buckets('mean("value")', "protolab_req_failed"), "protolab $tag_scenario"),
            ],
            "percentunit",
            8,
        ),
        timeseries(
            "Responses/s by status",
            "HTTP status codes per second (status 0: no response).",
            [
                influx(
                    influx_buckets(PER_SECOND, "http_reqs", ("scenario", "status")),
                    "$tag_scenario $tag_status",
                )
            ],
            "reqps",
            8,
        ),
        k6_checks(width=8),
        row("Latency"),
        timeseries(
            "Latency percentiles (http_req_duration)",
            "Sending + waiting + receiving, by negotiated protocol; connection setup is excluded.",
            [
                influx(
                    influx_buckets(percentile_columns(), "http_req_duration", by_proto),
                    "$tag_scenario $tag_proto $col",
                )
            ],
            "ms",
        ),
        timeseries(
            "Request phases (mean)",
            "Where the time of a request goes: blocked (waiting for a connection), connecting, TLS "
            "handshaking, sending, waiting (time to first byte) and receiving.",
            phases,
            "ms",
        ),
        timeseries(
            "Connection setup (max)",
            "The slowest blocked, connecting and TLS handshake times per bucket: reused connections "
            "report 0, so means hide the handshakes.",
            setup,
            "ms",
        ),
        k6_data_transfer(),
    ]
    return dashboard(
        "protolab-k6-http",
        "protolab / k6 client: HTTP",
        "What k6 saw of the REST targets (HTTP/1.1 and HTTP/2), from InfluxDB.",
        influx_variables("http_reqs"),
        panels,
    )


def k6_grpc() -> Json:
    by_method = ("scenario", "method")
    panels = [
        row("Load"),
        vus_panel("gRPC scenarios only."),
        timeseries(
            "Successful requests/s",
            "`protolab_reqs`: unary calls or completed streams that passed, per second. k6 has no "
            "gRPC request counter; this is the same metric as on the HTTP dashboard.",
            [influx(influx_buckets(PER_SECOND, "protolab_reqs"), "$tag_scenario")],
            "reqps",
            8,
        ),
        timeseries(
            "Calls/s by gRPC status",
            "`grpc_req_duration` samples per second by status code (0 = OK).",
            [
                influx(
                    influx_buckets(
                        'count("value") * 1000 / $__interval_ms', "grpc_req_duration", ("scenario", "status")
                    ),
                    "$tag_scenario status $tag_status",
                )
            ],
            "reqps",
            8,
        ),
        row("Errors"),
        timeseries(
            "Failure rate",
            "`protolab_req_failed`: share of calls or streams that failed (status, message count or checks).",
            [influx(influx_buckets('mean("value")', "protolab_req_failed"), "$tag_scenario")],
            "percentunit",
        ),
        k6_checks(),
        row("Latency"),
        timeseries(
            "Latency percentiles (the lab's clock)",
            "grpc_req_duration of the calls k6 did not decode: the unary call, or the whole stream to "
            "its last message, on the wire; what the runner's results and findings use.",
            [influx(clock_buckets(percentile_columns()), "$tag_scenario $col")],
            "ms",
        ),
        timeseries(
            "Latency percentiles (grpc_req_duration)",
            "k6's own gRPC timing, by method.",
            [
                influx(
                    influx_buckets(percentile_columns((50, 90, 99)), "grpc_req_duration", by_method),
                    "$tag_scenario $tag_method $col",
                )
            ],
            "ms",
        ),
        row("Streaming"),
        timeseries(
            "Streams/s",
            "Server streams opened per second (`grpc_streams`).",
            [influx(influx_buckets(PER_SECOND, "grpc_streams", by_method), "$tag_scenario $tag_method")],
            "reqps",
            8,
        ),
        timeseries(
            "Stream messages/s",
            "Messages received and sent on streams per second (`grpc_streams_msgs_*`).",
            [
                influx(
                    influx_buckets(PER_SECOND, "grpc_streams_msgs_received", by_method),
                    "received $tag_scenario",
                ),
                influx(influx_buckets(PER_SECOND, "grpc_streams_msgs_sent", by_method), "sent $tag_scenario"),
            ],
            "short",
            8,
        ),
        k6_data_transfer(width=8),
    ]
    return dashboard(
        "protolab-k6-grpc",
        "protolab / k6 client: gRPC",
        "What k6 saw of the gRPC targets (unary and server streaming), from InfluxDB.",
        influx_variables("grpc_req_duration"),
        panels,
    )


def service() -> Json:
    http = "http_server_request_duration_seconds"
    version = "scenario, network_protocol_version"
    cpu_used = prom_rate("protolab_cgroup_cpu_usage_seconds_total", "scenario")
    cpu_quota = f"max by (scenario) ({prom_selector('protolab_cgroup_cpu_limit_cores')})"
    panels = [
        row("HTTP"),
        timeseries(
            "Requests/s by protocol version",
            "Requests the REST services handled, by HTTP version.",
            [prom(prom_rate(f"{http}_count", version), "{{scenario}} HTTP/{{network_protocol_version}}")],
            "reqps",
            8,
        ),
        timeseries(
            "Latency quantiles",
            "Server-side request duration from the histogram, by HTTP version.",
            [
                prom(
                    prom_quantile(q, http, version),
                    f"p{round(q * 100)} {{{{scenario}}}} HTTP/{{{{network_protocol_version}}}}",
                )
                for q in (0.5, 0.9, 0.99)
            ],
            "s",
            8,
        ),
        timeseries(
            "Responses/s by status code",
            "Responses per second by HTTP status code.",
            [
                prom(
                    prom_rate(f"{http}_count", "scenario, http_response_status_code"),
                    "{{scenario}} {{http_response_status_code}}",
                )
            ],
            "reqps",
            8,
        ),
        row("CPU"),
        timeseries(
            "CPU used vs quota",
            "Cores the service's cgroup used, against its CPU quota (no quota line: unlimited).",
            [prom(cpu_used, "used {{scenario}}"), prom(cpu_quota, "quota {{scenario}}")],
            "short",
            6,
        ),
        timeseries(
            "CPU used / quota",
            "Share of the CPU quota in use; near 100% the service is CPU bound.",
            [prom(f"{cpu_used} / {cpu_quota}", "{{scenario}}")],
            "percentunit",
            6,
        ),
        timeseries(
            "Throttled periods",
            "Share of CFS periods in which the quota throttled the service.",
            [
                prom(
                    f"{prom_rate('protolab_cgroup_cpu_throttled_periods_total', 'scenario')}"
                    f" / {prom_rate('protolab_cgroup_cpu_periods_total', 'scenario')}",
                    "{{scenario}}",
                )
            ],
            "percentunit",
            6,
        ),
        timeseries(
            "Throttled time",
            "Seconds per second the service's threads spent throttled (summed over CPUs).",
            [prom(prom_rate("protolab_cgroup_cpu_throttled_seconds_total", "scenario"), "{{scenario}}")],
            "s",
            6,
        ),
        row("Memory and build"),
        timeseries(
            "Memory vs limit",
            "The cgroup's memory in use and its peak, against its limit (no limit line: unlimited).",
            [
                prom(
                    f"max by (scenario) ({prom_selector(f'protolab_cgroup_memory_{m}_bytes')})",
                    f"{m} {{{{scenario}}}}",
                )
                for m in ("usage", "peak", "limit")
            ],
            "bytes",
            16,
        ),
        stat(
            "Workers",
            "Worker processes serving, sized from the CPU quota.",
            [prom(f"max by (scenario) ({prom_selector('protolab_workers')})", "{{scenario}}")],
            width=8,
        ),
        table(
            "Build info",
            "What each scenario's service ran with.",
            # Over the whole range: the series of a stopped service are stale at its end.
            [
                prom(
                    f"last_over_time({prom_selector('protolab_build_info')}[$__range])",
                    instant=True,
                    table=True,
                )
            ],
            transformations=[hide_columns("Time", "Value", "__name__", "instance", "job")],
            height=6,
        ),
    ]
    return dashboard(
        "protolab-service",
        "protolab / service",
        "The system under test from its own metrics (Prometheus): requests, latency, CPU, memory.",
        prom_variables("protolab_workers"),
        panels,
    )


def grpc_server() -> Json:
    handled = "grpc_server_handled_total"
    method = "scenario, grpc_method"
    non_ok = prom_rate(handled, method, 'grpc_code!="OK"')
    panels = [
        row("RPCs"),
        timeseries(
            "Handled RPCs/s by method and code",
            "Completed RPCs per second (a stream counts once).",
            [prom(prom_rate(handled, f"{method}, grpc_code"), "{{scenario}} {{grpc_method}} {{grpc_code}}")],
            "reqps",
        ),
        timeseries(
            "Non-OK ratio",
            "Share of RPCs that ended with a code other than OK (0 when there are none).",
            [
                prom(
                    f"({non_ok} or {prom_rate(handled, method)} * 0) / {prom_rate(handled, method)}",
                    "{{scenario}} {{grpc_method}}",
                )
            ],
            "percentunit",
        ),
        row("Latency"),
        timeseries(
            "Handling time quantiles",
            "Time from receiving the call to sending its status, by method.",
            [
                prom(
                    prom_quantile(q, "grpc_server_handling_seconds", method),
                    f"p{round(q * 100)} {{{{scenario}}}} {{{{grpc_method}}}}",
                )
                for q in (0.5, 0.9, 0.99)
            ],
            "s",
        ),
        timeseries(
            "Started vs handled RPCs/s",
            "Started RPCs running ahead of handled ones means calls are queueing.",
            [
                prom(prom_rate("grpc_server_started_total", method), "started {{scenario}} {{grpc_method}}"),
                prom(prom_rate(handled, method), "handled {{scenario}} {{grpc_method}}"),
            ],
            "reqps",
        ),
        row("Messages"),
        timeseries(
            "Messages/s",
            "Messages received and sent per second, by method.",
            [
                prom(
                    prom_rate("grpc_server_msg_received_total", method),
                    "received {{scenario}} {{grpc_method}}",
                ),
                prom(prom_rate("grpc_server_msg_sent_total", method), "sent {{scenario}} {{grpc_method}}"),
            ],
        ),
        timeseries(
            "In flight",
            "RPCs started and not yet handled.",
            [
                prom(
                    f"sum by ({method}) ({prom_selector('grpc_server_started_total')})"
                    f" - sum by ({method}) ({prom_selector(handled)})",
                    "{{scenario}} {{grpc_method}}",
                )
            ],
        ),
    ]
    return dashboard(
        "protolab-grpc-server",
        "protolab / gRPC server",
        "The gRPC service from its go-grpc-prometheus style metrics (Prometheus).",
        prom_variables("grpc_server_started_total"),
        panels,
    )


def matrix() -> Json:
    peak_memory = prom_selector("protolab_cgroup_memory_peak_bytes")
    panels = [
        row("Scenarios side by side (k6)"),
        table(
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
        ),
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
        row("Over time"),
        timeseries(
            "Client requests/s",
            "Successful requests per second as k6 saw them; the annotations mark each scenario.",
            [influx(influx_buckets(PER_SECOND, "protolab_reqs"), "$tag_scenario")],
            "reqps",
        ),
        timeseries(
            "Client p99 latency",
            "99th percentile per bucket, on the lab's clock.",
            [influx(clock_buckets('percentile("value", 99)'), "$tag_scenario")],
            "ms",
        ),
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
    return dashboard(
        "protolab-matrix",
        "protolab / matrix comparison",
        "Every scenario of a run side by side: client throughput and latency, server work.",
        influx_variables("protolab_reqs"),
        panels,
    )


DASHBOARDS: dict[str, Callable[[], Json]] = {
    "k6-http": k6_http,
    "k6-grpc": k6_grpc,
    "service": service,
    "grpc-server": grpc_server,
    "matrix": matrix,
}


# Hand-import variants -------------------------------------------------------------------------------


def importable(provisioned: Json) -> Json:
    """The dashboard with ${DS_*} inputs in place of the provisioned datasource uids.

    Grafana's Import page asks for one datasource per input and substitutes its uid.
    """
    by_uid = {ds.uid: ds for ds in DATASOURCES}
    used: dict[str, Datasource] = {}

    def swap(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("datasource")
            if isinstance(ref, dict) and ref.get("uid") in by_uid:
                source = by_uid[ref["uid"]]
                used[source.input] = source
                node = {**node, "datasource": {"type": source.type, "uid": f"${{{source.input}}}"}}
            return {key: swap(value) for key, value in node.items()}
        if isinstance(node, list):
            return [swap(item) for item in node]
        return node

    body = swap(provisioned)
    sources = sorted(used.values(), key=lambda s: s.input)
    panel_types = sorted({p["type"] for p in provisioned["panels"] if p["type"] != "row"})
    inputs = [
        {
            "name": source.input,
            "label": source.name,
            "description": f"The {source.name} datasource holding protolab's data",
            "type": "datasource",
            "pluginId": source.type,
            "pluginName": source.name,
        }
        for source in sources
    ]
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
        *({"type": "datasource", "id": s.type, "name": s.name, "version": "1.0.0"} for s in sources),
        *({"type": "panel", "id": kind, "name": kind, "version": ""} for kind in panel_types),
    ]
    return {"__inputs": inputs, "__requires": requires, **body}


# Files ---------------------------------------------------------------------------------------------


def render(data: Json) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def expected_files() -> dict[Path, str]:
    files = {}
    for name, build in DASHBOARDS.items():
        provisioned = build()
        files[DASHBOARDS_DIR / f"{name}.json"] = render(provisioned)
        files[IMPORT_DIR / f"{name}.json"] = render(importable(provisioned))
    return files


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """JSON files in the generated folders that the generator no longer writes (a removed dashboard)."""
    return sorted(
        p for d in (DASHBOARDS_DIR, IMPORT_DIR) if d.is_dir() for p in d.glob("*.json") if p not in expected
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 listing files that differ"
    )
    args = parser.parse_args(argv)
    expected = expected_files()
    differing = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    stale = stale_files(expected)
    if args.check:
        for path in [*differing, *stale]:
            print(f"out of date: {path.relative_to(REPO)}", file=sys.stderr)
        if differing or stale:
            print("run: python scripts/gen_dashboards.py", file=sys.stderr)
            return 1
        return 0
    for path in differing:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(REPO)}")
    for path in stale:
        path.unlink()
        print(f"removed {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
