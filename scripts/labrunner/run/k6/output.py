"""What k6 writes: the summary its handleSummary writes, as K6Metrics, and an instance's raw CSV
output, as the samples of its clock."""

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.run.k6_stats import LATENCY_STATS, Quantiles, quantile_grid

# Summaries written before each script named its clock (k6/lib/common.js summaryHandler) timed
# latency in protolab_req_duration.
DEFAULT_LATENCY_METRIC = "protolab_req_duration"


@dataclass(frozen=True)
class K6Metrics:
    """The numbers a scenario result needs from a k6 summary."""

    requests: int  # successful requests (protolab_reqs)
    requests_per_second: float
    attempts: int  # protolab_req_failed samples: every request, failed or not
    errors: int
    error_rate: float | None
    latency_ms: Mapping[str, float | None]  # LATENCY_STATS of the clock: avg, p50 ... p99.9, max
    latency_metric: str  # the clock: the k6 metric the script names (k6's own timer of each request)
    latency_count: int  # samples of the clock
    latency_quantiles_ms: Quantiles  # (fraction, ms) on quantile_grid(), min and max
    data_received_bytes: int
    data_received_bytes_per_second: float
    dropped_iterations: int
    iterations: int
    checks_passed: int
    checks_failed: int
    vus_max: int | None
    test_run_seconds: float | None
    failed_thresholds: tuple[str, ...]
    connections_opened: int = 0  # the connections the script dialed (protolab_connections: k6/lib/common.js)


def read_summary(path: Path) -> dict[str, Any] | None:
    """The handleSummary JSON, None when k6 did not write one (it crashed or was killed)."""
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary


def parse_summary(summary: Mapping[str, Any]) -> K6Metrics:
    """The scenario's numbers from a summary; absent metrics (no dropped iterations) are 0."""
    metrics: Mapping[str, Any] = summary.get("metrics", {})

    def value(metric: str, key: str) -> Any:
        return _values(metrics, metric).get(key)

    failed = value("protolab_req_failed", "passes") or 0
    succeeded = value("protolab_req_failed", "fails") or 0
    duration_ms = summary.get("state", {}).get("testRunDurationMs")
    clock = (summary.get("protolab") or {}).get("latency_metric") or DEFAULT_LATENCY_METRIC
    return K6Metrics(
        requests=int(value("protolab_reqs", "count") or 0),
        requests_per_second=float(value("protolab_reqs", "rate") or 0.0),
        attempts=int(failed + succeeded),
        errors=int(failed),
        error_rate=value("protolab_req_failed", "rate") if failed + succeeded else None,
        latency_ms={k: value(clock, s) for k, s in LATENCY_STATS.items()},
        latency_metric=clock,
        latency_count=int(value(clock, "count") or 0),
        latency_quantiles_ms=_quantiles(_values(metrics, clock)),
        data_received_bytes=int(value("data_received", "count") or 0),
        data_received_bytes_per_second=float(value("data_received", "rate") or 0.0),
        dropped_iterations=int(value("dropped_iterations", "count") or 0),
        iterations=int(value("iterations", "count") or 0),
        checks_passed=int(value("checks", "passes") or 0),
        checks_failed=int(value("checks", "fails") or 0),
        # k6's vus_max is sampled once a second; protolab_vus (k6/lib/common.js) covers shorter runs.
        vus_max=value("vus_max", "max") or value("protolab_vus", "max"),
        test_run_seconds=duration_ms / 1000 if duration_ms is not None else None,
        failed_thresholds=_failed_thresholds(metrics),
        connections_opened=int(value("protolab_connections", "count") or 0),
    )


def _values(metrics: Mapping[str, Any], metric: str) -> Mapping[str, Any]:
    """A metric's values in the summary ({"count", "rate"}, {"avg", "p(50)", ...}); empty when absent."""
    values: Mapping[str, Any] = metrics.get(metric, {}).get("values", {})
    return values


def _quantiles(clock: Mapping[str, Any]) -> Quantiles:
    """The clock's minimum, quantile_grid() and maximum as (fraction, ms); empty when the summary lacks
    any of them (an older summary: no pooling, report/compare.py falls back)."""
    grid: list[tuple[float, Any]] = [
        (0.0, clock.get("min")),
        *((f, clock.get(stat)) for stat, f in quantile_grid().items()),
        (1.0, clock.get("max")),
    ]
    return tuple((f, float(v)) for f, v in grid) if all(v is not None for _, v in grid) else ()


def _failed_thresholds(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """ "<metric> <expression>" of every threshold k6 marked failed, in name order."""
    return tuple(
        f"{name} {expression}"
        for name, metric in sorted(metrics.items())
        for expression, state in sorted(metric.get("thresholds", {}).items())
        if not state.get("ok", True)
    )


def take_latency_samples(raw_file: Path, clock: str) -> list[float]:
    """The samples of the clock (a metric or a submetric such as grpc_req_duration{decoded:no}) in an
    instance's raw CSV output; they replace it, one value per line in <raw>.latency_ms.txt (the CSV
    holds every metric's samples and grows fast)."""
    name, tags = parse_submetric(clock)
    samples: list[float] = []
    try:
        with raw_file.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["metric_name"] == name and _has_tags(row, tags):
                    samples.append(float(row["metric_value"]))
    except OSError:
        return []  # no raw output: merge_runs() names the instance whose samples are missing
    kept = raw_file.with_suffix(".latency_ms.txt")
    kept.write_text("".join(f"{value!r}\n" for value in samples))
    raw_file.unlink()
    return samples


def parse_submetric(selector: str) -> tuple[str, dict[str, str]]:
    """k6's "metric{tag:value,...}" as the metric's name and the tags it selects."""
    name, _, rest = selector.partition("{")
    pairs = (item.split(":", 1) for item in rest.rstrip("}").split(",") if item)
    return name, {key.strip(): value.strip() for key, value in pairs}


def _has_tags(row: Mapping[str, str], tags: Mapping[str, str]) -> bool:
    """Whether a CSV sample carries the tags: a system tag has its own column, any other tag is in
    extra_tags as "key=value&key=value"."""
    extra = dict(pair.split("=", 1) for pair in (row.get("extra_tags") or "").split("&") if "=" in pair)
    return all(row.get(key, extra.get(key)) == value for key, value in tags.items())
