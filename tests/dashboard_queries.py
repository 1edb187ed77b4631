"""Run every query of protolab's Grafana dashboards against live Prometheus and InfluxDB, as Grafana would."""

from __future__ import annotations

import contextlib
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT

DASHBOARDS_DIR = ROOT / "grafana" / "dashboards"
DATASOURCES_YML = ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yml"
# Grafana asks for about one point per pixel; a full-width panel is about this wide.
MAX_DATA_POINTS = 1000
# Grafana's fallback when a Prometheus datasource sets no scrape interval.
DEFAULT_SCRAPE_MS = 15_000
HTTP_TIMEOUT_S = 30.0
ALL = "$__all"

Json = dict[str, Any]
VariableValues = Mapping[str, str | Sequence[str]]

# Grafana's template syntax: $var, [[var:format]], ${var.fieldPath:format}.
TEMPLATE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
_DURATION = re.compile(r"^>?(\d+)(ms|s|m|h|d|w|y)$")
_UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}
# Grafana's rangeutil.roundInterval: (below this many ms, use this interval).
_ROUND_INTERVAL_MS = (
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000), (3_500, 2_000),
    (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000), (45_000, 30_000),
    (90_000, 60_000), (210_000, 120_000), (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000),
    (1_500_000, 1_200_000), (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
    (604_800_000, 86_400_000), (1_814_400_000, 604_800_000), (3_628_800_000, 2_592_000_000),
)  # fmt: skip
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+)\s*,\s*)?(?P<label>\w+)\s*\)\s*$")


@dataclass(frozen=True)
class QueryResult:
    """One query as sent and how many series (or variable values) came back with data."""

    dashboard: str
    location: str
    query: str
    series: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.series > 0


@dataclass(frozen=True)
class Failure:
    """A query that failed or returned no data: a dead panel, variable or annotation."""

    dashboard: str
    location: str
    query: str
    reason: str

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.location}: {self.reason}\n    {self.query}"


@dataclass(frozen=True)
class Datasource:
    """What the executor needs of a provisioned datasource."""

    type: str
    min_interval_ms: int


@dataclass(frozen=True)
class Variable:
    """A resolved template variable: its flags and the values it stands for."""

    multi: bool
    include_all: bool
    values: tuple[str, ...]
    # Set when "All" is selected and the variable defines a custom all value.
    all_value: str | None = None


class QueryError(Exception):
    """A query the datasource rejected or the executor cannot run."""


def check_dashboards(
    prom_url: str,
    influx_url: str,
    start: datetime,
    end: datetime,
    variables: VariableValues | None = None,
    dashboards: Iterable[Path] | None = None,
) -> list[Failure]:
    """Every panel target, template variable and annotation query that errs or returns no data.

    variables: values by name (a string, a list, or "$__all"); unset ones take Grafana's
    default, "All" where allowed, else the first value.
    """
    return [
        Failure(r.dashboard, r.location, r.query, r.error or "no data")
        for r in run_dashboards(prom_url, influx_url, start, end, variables, dashboards)
        if not r.ok
    ]


def run_dashboards(
    prom_url: str,
    influx_url: str,
    start: datetime,
    end: datetime,
    variables: VariableValues | None = None,
    dashboards: Iterable[Path] | None = None,
) -> list[QueryResult]:
    """Run every query of the dashboards (default: grafana/dashboards/*.json) over [start, end]."""
    paths = sorted(DASHBOARDS_DIR.glob("*.json")) if dashboards is None else list(dashboards)
    runner = _Runner(prom_url, influx_url, int(start.timestamp() * 1000), int(end.timestamp() * 1000))
    results: list[QueryResult] = []
    for path in paths:
        results.extend(runner.run(json.loads(path.read_text()), variables or {}))
    return results


def load_datasources(path: Path = DATASOURCES_YML) -> dict[str, Datasource]:
    """Provisioned datasources by uid, with their minimum interval (jsonData.timeInterval)."""
    config = yaml.safe_load(path.read_text())
    return {
        ds["uid"]: Datasource(ds["type"], parse_duration_ms(ds.get("jsonData", {}).get("timeInterval", "")))
        for ds in config["datasources"]
    }


# Grafana's interval and escaping rules ---------------------------------------------------------------


def parse_duration_ms(text: str) -> int:
    """'2s' or '>2s' in ms; '' is 0 (no minimum)."""
    if not text:
        return 0
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a Grafana interval: {text!r}")
    return int(match[1]) * _UNIT_MS[match[2]]


def round_interval(ms: float) -> int:
    return next((step for limit, step in _ROUND_INTERVAL_MS if ms < limit), 31_536_000_000)


def interval_text(ms: int) -> str:
    """Grafana's secondsToHms for the intervals round_interval yields."""
    for unit in ("y", "w", "d", "h", "m", "s"):
        if ms >= _UNIT_MS[unit] and unit != "w":
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def regex_escape(value: str) -> str:
    """Grafana's kbn.regexEscape (InfluxDB and the :regex format); escapes / for /.../ literals."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m[0], value)


def prom_regular_escape(value: str) -> str:
    """Grafana's escaping of a single-valued variable inside a PromQL string."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def prom_regex_escape(value: str) -> str:
    """Grafana's escaping of multi-valued variables: a regex inside a PromQL string, hence doubled."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m[0], value)


def format_variable(variable: Variable, datasource_type: str, fmt: str | None) -> str:
    """A variable's text in a query, as Grafana's datasource (or an explicit :format) renders it."""
    if variable.all_value is not None:
        return variable.all_value
    values = list(variable.values)
    if fmt == "regex":
        escaped = [regex_escape(v) for v in values]
    elif fmt in ("pipe", "csv", "raw"):
        return ("|" if fmt == "pipe" else ",").join(values)
    elif fmt is not None:
        raise QueryError(f"variable format :{fmt} is not supported by the executor")
    elif not (variable.multi or variable.include_all):
        first = values[0] if values else ""
        return prom_regular_escape(first) if datasource_type == "prometheus" else first
    elif datasource_type == "prometheus":
        escaped = [prom_regex_escape(v) for v in values]
    else:
        escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate(
    text: str, variables: Mapping[str, Variable], macros: Mapping[str, str], datasource_type: str
) -> str:
    """Replace macros and template variables; unknown names stay, as in Grafana."""

    def replace(match: re.Match[str]) -> str:
        name = match[1] or match[2] or match[4]
        fmt = match[3] or match[6]
        if name in macros:
            return macros[name]
        if name in variables:
            return format_variable(variables[name], datasource_type, fmt)
        return match[0]

    return TEMPLATE.sub(replace, text)


def sort_values(values: list[str], mode: int) -> list[str]:
    """Grafana's variable sort: 0 none, 1/2 alphabetical, 3/4 numerical, 5/6 case-insensitive (asc/desc)."""
    if mode == 0:
        return values
    key = {1: str, 2: str, 3: _leading_number, 4: _leading_number, 5: str.lower, 6: str.lower}[mode]
    ordered = sorted(values, key=key)
    return ordered[::-1] if mode % 2 == 0 else ordered


def _leading_number(value: str) -> float:
    match = re.search(r"-?\d+(?:\.\d+)?", value)
    return float(match[0]) if match else math.nan


# Running queries -------------------------------------------------------------------------------------


class _Runner:
    """Runs one dashboard's queries like Grafana over a fixed time range."""

    def __init__(self, prom_url: str, influx_url: str, from_ms: int, to_ms: int) -> None:
        self._urls = {"prometheus": prom_url.rstrip("/"), "influxdb": influx_url.rstrip("/")}
        self._datasources = load_datasources()
        self._from_ms = from_ms
        self._to_ms = to_ms

    def run(self, dashboard: Json, requested: VariableValues) -> list[QueryResult]:
        uid = dashboard.get("uid", "?")
        results: list[QueryResult] = []
        variables: dict[str, Variable] = {}
        for spec in dashboard.get("templating", {}).get("list", []):
            result, variable = self._variable(uid, spec, variables, requested.get(spec["name"]))
            results.append(result)
            variables[spec["name"]] = variable
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                location = f"panel {panel.get('title', '?')!r} {target.get('refId', '?')}"
                ref = target.get("datasource") or panel.get("datasource") or {}
                results.append(self._target(uid, location, ref, target, panel, variables))
        for annotation in dashboard.get("annotations", {}).get("list", []):
            ref = annotation.get("datasource") or {}
            if (
                annotation.get("enable", True)
                and ref.get("type") != "grafana"
                and not annotation.get("builtIn")
            ):
                location = f"annotation {annotation.get('name', '?')!r}"
                body = {**annotation, **annotation.get("target", {})}
                results.append(self._target(uid, location, ref, body, {}, variables))
        return results

    def _variable(
        self, uid: str, spec: Json, resolved: Mapping[str, Variable], requested: str | Sequence[str] | None
    ) -> tuple[QueryResult, Variable]:
        location = f"variable {spec['name']}"
        query = spec.get("query", "")
        if isinstance(query, dict):  # newer Grafana stores {"query": ..., "refId": ...}
            query = query.get("query", "")
        options: list[str] = []
        try:
            if spec.get("type") != "query":
                raise QueryError(f"variable type {spec.get('type')!r} is not supported by the executor")
            if spec.get("regex"):
                raise QueryError("variable regex filters are not supported by the executor")
            datasource = self._datasource(spec.get("datasource") or {})
            query = interpolate(query, resolved, self._macros(datasource, {}), datasource.type)
            options = sort_values(list(dict.fromkeys(self._values(datasource, query))), spec.get("sort", 0))
            result = QueryResult(uid, location, query, len(options))
        except QueryError as exc:
            result = QueryResult(uid, location, query, 0, str(exc))
        multi, include_all = bool(spec.get("multi")), bool(spec.get("includeAll"))
        picked = [requested] if isinstance(requested, str) else list(requested or [])
        if include_all and (not picked or picked in ([ALL], ["All"])):
            variable = Variable(multi, include_all, tuple(options), spec.get("allValue") or None)
        else:
            variable = Variable(multi, include_all, tuple(picked or options[:1]))
        return result, variable

    def _target(
        self, uid: str, location: str, ref: Json, target: Json, panel: Json, variables: Mapping[str, Variable]
    ) -> QueryResult:
        query = target.get("expr") or target.get("query") or ""
        try:
            datasource = self._datasource(ref)
            if datasource.type == "influxdb" and target.get("rawQuery") is False:
                raise QueryError("only raw InfluxQL targets are supported by the executor")
            macros = self._macros(datasource, panel)
            query = interpolate(query, variables, macros, datasource.type)
            if not query.strip():
                raise QueryError("empty query")
            if datasource.type == "prometheus":
                series = self._prometheus(query, int(macros["__interval_ms"]), bool(target.get("instant")))
            else:
                series = _influx_series(self._influx(query))
            return QueryResult(uid, location, query, series)
        except QueryError as exc:
            return QueryResult(uid, location, query, 0, str(exc))

    def _datasource(self, ref: Json) -> Datasource:
        datasource = self._datasources.get(ref.get("uid", ""))
        if datasource is None:
            raise QueryError(f"datasource {ref!r} is not provisioned")
        if datasource.type not in self._urls:
            raise QueryError(f"datasource type {datasource.type!r} is not supported by the executor")
        return datasource

    def _macros(self, datasource: Datasource, panel: Json) -> dict[str, str]:
        """Grafana's global and datasource macros for one query of a panel."""
        range_ms = self._to_ms - self._from_ms
        max_points = panel.get("maxDataPoints") or MAX_DATA_POINTS
        low_ms = parse_duration_ms(panel.get("interval") or "") or datasource.min_interval_ms
        interval_ms = max(round_interval(range_ms / max_points), low_ms)
        macros = {
            "__interval": interval_text(interval_ms),
            "__interval_ms": str(interval_ms),
            "__range": f"{round(range_ms / 1000)}s",
            "__range_s": str(round(range_ms / 1000)),
            "__range_ms": str(range_ms),
            "__from": str(self._from_ms),
            "__to": str(self._to_ms),
        }
        if datasource.type == "influxdb":
            macros["timeFilter"] = f"time >= {self._from_ms}ms and time <= {self._to_ms}ms"
        else:
            scrape_ms = datasource.min_interval_ms or DEFAULT_SCRAPE_MS
            rate_ms = max(interval_ms + scrape_ms, 4 * scrape_ms)
            macros["__rate_interval"] = f"{rate_ms // 1000}s" if rate_ms % 1000 == 0 else f"{rate_ms}ms"
        return macros

    def _values(self, datasource: Datasource, query: str) -> list[str]:
        """A variable query's values: label_values() on Prometheus, any InfluxQL (SHOW TAG VALUES)."""
        if datasource.type == "influxdb":
            values: list[str] = []
            for result in self._influx(query).get("results", []):
                for series in result.get("series", []):
                    column = series["columns"].index("value") if "value" in series["columns"] else -1
                    values.extend(str(row[column]) for row in series.get("values", []))
            return values
        match = _LABEL_VALUES.match(query)
        if not match:
            raise QueryError("only label_values() Prometheus variable queries are supported by the executor")
        params: dict[str, Any] = {"start": self._from_ms / 1000, "end": self._to_ms / 1000}
        if match["match"]:
            params["match[]"] = match["match"]
        label = urllib.parse.quote(match["label"])
        body = _http_json(f"{self._urls['prometheus']}/api/v1/label/{label}/values", params, post=False)
        return [str(v) for v in _prom_data(body)]

    def _prometheus(self, expr: str, interval_ms: int, instant: bool) -> int:
        url = self._urls["prometheus"]
        if instant:
            body = _http_json(f"{url}/api/v1/query", {"query": expr, "time": self._to_ms / 1000})
            return _prom_series(_prom_data(body))
        # Grafana's step: the interval, at most 11000 points, with start and end aligned to it.
        step_s = max(interval_ms / 1000, (self._to_ms - self._from_ms) / 1000 / 11_000)
        start = math.floor(self._from_ms / 1000 / step_s) * step_s
        end = math.floor(self._to_ms / 1000 / step_s) * step_s
        params = {"query": expr, "start": start, "end": end, "step": step_s}
        return _prom_series(_prom_data(_http_json(f"{url}/api/v1/query_range", params)))

    def _influx(self, query: str) -> Json:
        # The database and epoch=ms as Grafana's InfluxQL datasource sends them.
        params = {"db": "myk6db", "q": query, "epoch": "ms"}
        body = _http_json(f"{self._urls['influxdb']}/query", params)
        errors = [r["error"] for r in body.get("results", []) if "error" in r]
        if "error" in body or errors:
            raise QueryError(body.get("error") or "; ".join(errors))
        return body


def _panels(dashboard: Json) -> list[Json]:
    """Every panel with queries, including those inside collapsed rows."""
    panels = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def _http_json(url: str, params: Mapping[str, Any], post: bool = True) -> Json:
    data = urllib.parse.urlencode(params)
    request = (
        urllib.request.Request(url, data=data.encode()) if post else urllib.request.Request(f"{url}?{data}")
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        # Both APIs explain a rejected query in a JSON body with the error status.
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("error", detail)
        raise QueryError(f"HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise QueryError(f"{url}: {exc}") from exc


def _prom_data(body: Json) -> Any:
    if body.get("status") != "success":
        raise QueryError(body.get("error", "Prometheus query failed"))
    return body["data"]


def _prom_series(data: Json) -> int:
    """Series with at least one finite value (Grafana shows NaN as no value)."""
    if data["resultType"] == "scalar":
        samples: list[list[Any]] = [[data["result"]]]
    elif data["resultType"] == "matrix":
        samples = [series["values"] for series in data["result"]]
    else:
        samples = [[series["value"]] for series in data["result"]]
    return sum(any(math.isfinite(float(value)) for _, value in points) for points in samples)


def _influx_series(body: Json) -> int:
    """Series with at least one non-null value outside the time column."""
    count = 0
    for result in body.get("results", []):
        for series in result.get("series", []):
            columns = series["columns"]
            rows = series.get("values", [])
            count += any(
                v is not None for row in rows for c, v in zip(columns, row, strict=True) if c != "time"
            )
    return count
