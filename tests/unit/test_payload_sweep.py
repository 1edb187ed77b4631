"""Unit tests: the payload sweep (gRPC / REST by count, where it crosses 1) and its charts."""

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from labrunner.model.matrix import Overrides, Scenario, expand, load_matrix
from labrunner.report import payload_charts
from labrunner.report import payload_sweep as ps
from labrunner.report.build import write_report
from labrunner.report.compare import group_results
from labrunner.report.payload import SCHEMA as PAYLOAD_SCHEMA
from labrunner.report.payload import PayloadRow
from labrunner.report.stats import Ratio, ratio
from labrunner.results.store import RESULT_SCHEMA, result_path, write_json_atomic

from tests.support import ROOT, ok_result

# The sizes report/payload.py measures for the default pool (seed and size of services/common).
ROWS = (
    PayloadRow(1, 193, 165, 72, 92),
    PayloadRow(10, 1836, 607, 747, 591),
    PayloadRow(100, 18253, 3627, 7477, 3789),
    PayloadRow(1000, 183037, 28752, 75345, 28345),
)
JSON_BYTES = {r.count: r.json_bytes for r in ROWS}
COUNTS = (1, 10, 100, 1000)
DURATION_S = 8.0
QUOTA_USED = 0.9  # of the quarter profile: CPU-bound, so no group is a lower bound
# Per-repeat factors on each side, different on the two sides so both have spread.
JITTER = {"grpc": (1.0, 1.03, 0.97), "rest": (0.98, 1.0, 1.02)}

Rates = Mapping[tuple[str, int], Sequence[float]]  # (target, count) -> req/s of each repeat


@cache
def _scenarios(targets: tuple[str, ...], repeats: int) -> tuple[Scenario, ...]:
    overrides = Overrides(targets=targets, repeats=repeats)
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides).scenarios


def _result(scenario: Scenario, rps: float, quota_used: float = QUOTA_USED) -> dict[str, Any]:
    requests = round(rps * DURATION_S)
    cpu_seconds = scenario.profile.cpus * quota_used * DURATION_S
    return ok_result(
        scenario,
        requests=requests,
        rps=requests / DURATION_S,
        latency_ms={"avg": 10.0, "p50": 9.0, "p90": 12.0, "p95": 14.0, "p99": 20.0},
        received_bytes=requests * JSON_BYTES[scenario.count],
        window_s=DURATION_S,
        cpu_seconds=cpu_seconds,
        quota_used=quota_used,
    )


def _results(rates: Rates, targets: tuple[str, ...] = ("aiohttp-h1", "grpc")) -> list[dict[str, Any]]:
    repeats = len(next(iter(rates.values())))
    return [
        _result(s, rates[s.target.name, s.count][s.repeat - 1])
        for s in _scenarios(targets, repeats)
        if (s.target.name, s.count) in rates
    ]


def _rates(
    rest: Mapping[int, float], grpc_over_rest: Mapping[int, float]
) -> dict[tuple[str, int], list[float]]:
    """Three repeats of aiohttp-h1 and grpc: grpc's req/s is grpc_over_rest times aiohttp's."""
    rates: dict[tuple[str, int], list[float]] = {}
    for count, base in rest.items():
        rates["aiohttp-h1", count] = [base * j for j in JITTER["rest"]]
        rates["grpc", count] = [base * grpc_over_rest[count] * j for j in JITTER["grpc"]]
    return rates


REST_RPS = {1: 900.0, 10: 800.0, 100: 300.0, 1000: 40.0}
# gRPC behind below 10 records, ahead from 100 on: the crossing lies between 10 and 100.
CROSSING = {1: 0.6, 10: 0.8, 100: 1.25, 1000: 1.6}


def _sweep(rates: Rates, targets: tuple[str, ...] = ("aiohttp-h1", "grpc")) -> ps.Sweep:
    (sweep,) = ps.sweeps(group_results(_results(rates, targets)), ROWS)
    return sweep


def _expected_crossing(low_count: int, high_count: int, at_low: float, at_high: float) -> float:
    """Log-log interpolation by hand: where log ratio reaches 0 between the two counts."""
    x0, x1 = math.log(JSON_BYTES[low_count]), math.log(JSON_BYTES[high_count])
    t = math.log(at_low) / (math.log(at_low) - math.log(at_high))
    return math.exp(x0 + t * (x1 - x0))


def test_the_payload_preset_sweeps_four_counts_over_rest_and_unary_grpc_with_and_without_tls() -> None:
    plan = expand(load_matrix(ROOT / "matrix.toml"), "local", "payload")
    assert {s.count for s in plan.scenarios} == set(COUNTS)
    assert {s.profile.name for s in plan.scenarios} == {"quarter"}
    assert {s.load_model.executor for s in plan.scenarios} == {"constant-vus"}
    targets = {s.target.name: s.target for s in plan.scenarios}
    assert {t.service for t in targets.values()} == {"rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio"}
    for service in ("rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio"):
        assert {t.tls for t in targets.values() if t.service == service} == {True, False}
    assert all(t.script != ps.STREAM_SCRIPT for t in targets.values())
    assert len(plan.scenarios) == 96


def test_the_crossing_between_10_and_100_records_is_found_with_its_interval() -> None:
    sweep = _sweep(_rates(REST_RPS, CROSSING))
    for metric, at_10, at_100 in (("rps", 0.8, 1.25), ("cpu_per_1k", 1 / 0.8, 1 / 1.25)):
        (crossing,) = sweep.crossings(metric)
        expected = _expected_crossing(10, 100, at_10, at_100)
        # Repeats' jitter moves the ratios' estimates by a few percent, the crossing with them.
        assert crossing.json_bytes == pytest.approx(expected, rel=0.05)
        assert JSON_BYTES[10] < crossing.json_bytes < JSON_BYTES[100]
        assert crossing.rising == (metric == "rps")
        assert crossing.interval is not None
        low, high = crossing.interval
        assert JSON_BYTES[1] < low < crossing.json_bytes < high < JSON_BYTES[1000]
        assert not crossing.open_below and not crossing.open_above
        assert 10 < crossing.records < 100
        assert JSON_BYTES[10] * 0.4 < crossing.protobuf_bytes < JSON_BYTES[100] * 0.42


def test_the_finding_names_the_crossing_its_interval_and_what_was_held_fixed() -> None:
    found = ps.findings(group_results(_results(_rates(REST_RPS, CROSSING))), ROWS)
    (pair,) = [f for f in found if f.sentence.startswith("grpc vs aiohttp-h1")]
    assert pair.question == "payload"
    assert re.search(
        r"CPU per request crosses at [\d.]+ KB of JSON \[[\d.]+ (B|KB), [\d.]+ KB\]", pair.sentence
    )
    assert "req/s crosses at" in pair.sentence
    assert "gRPC / REST 0.60x at 1, 1.60x at 1,000" in pair.sentence
    assert pair.sentence.endswith("quarter profile, build, closed (10 VUs), loopback, no TLS")
    assert pair.caveat == ""
    assert pair.effect == pytest.approx(math.log(1 / 0.6), rel=0.05)  # the largest ratio either way


def test_without_a_crossing_the_finding_says_so_with_the_range_of_ratios() -> None:
    ahead = {1: 0.5, 10: 0.55, 100: 0.7, 1000: 0.8}
    sweep = _sweep(_rates(REST_RPS, ahead))
    assert sweep.crossings("rps") == [] and sweep.crossings("cpu_per_1k") == []
    (pair, *_) = ps.findings(group_results(_results(_rates(REST_RPS, ahead))), ROWS)
    assert "req/s: no crossing between 1 and 1,000 records (gRPC / REST 0.50x [" in pair.sentence
    assert "0.80x [" in pair.sentence and "CPU per request: no crossing" in pair.sentence


def test_where_every_interval_includes_1_no_difference_is_detectable() -> None:
    rates = _rates(REST_RPS, {1: 0.9, 10: 0.95, 100: 1.05, 1000: 1.1})
    for (target, count), values in rates.items():  # repeats far apart: wide intervals on both sides
        rates[target, count] = [v * f for v, f in zip(values, (0.5, 1.0, 1.8), strict=True)]
    (pair, *_) = ps.findings(group_results(_results(rates)), ROWS)
    assert "req/s: no difference detectable between 1 and 1,000 records (gRPC / REST 0.9" in pair.sentence
    assert "CPU per request: no difference detectable" in pair.sentence
    assert pair.effect == 0.0


def test_the_interval_is_where_the_interpolated_band_contains_one() -> None:
    # In logs: estimate -1 -> +1 (crossing at the middle), low -1.5 -> 0.5 (below 0 up to t = 0.75),
    # high -0.5 -> 1.5 (above 0 from t = 0.25): the band contains 1 from t = 0.25 to t = 0.75.
    points = [
        ps.Point(1, 100, 40, Ratio(math.exp(-1), math.exp(-1.5), math.exp(-0.5), 0.01, True)),
        ps.Point(10, 10_000, 4000, Ratio(math.exp(1), math.exp(0.5), math.exp(1.5), 0.01, True)),
    ]
    (c,) = ps.crossings(points)
    assert c.json_bytes == pytest.approx(1000)  # halfway between 100 and 10,000 in logs
    assert c.records == pytest.approx(math.sqrt(10))
    assert c.interval == pytest.approx((100 * 100**0.25, 100 * 100**0.75))
    assert not c.open_below and not c.open_above


def test_an_interval_that_reaches_the_measured_ends_is_open() -> None:
    wide = [Ratio(e, e / 3, e * 3, 0.5, False) for e in (0.9, 0.95, 1.05, 1.1)]
    points = [ps.Point(c, JSON_BYTES[c], 1, r) for c, r in zip(COUNTS, wide, strict=True)]
    (c,) = ps.crossings(points)
    assert c.open_below and c.open_above
    assert c.interval == pytest.approx((JSON_BYTES[1], JSON_BYTES[1000]))
    assert "[<193 B, >183 KB]" in ps._crossing(c)


def test_one_repeat_gives_a_crossing_without_an_interval() -> None:
    rates = {k: v[:1] for k, v in _rates(REST_RPS, CROSSING).items()}
    (crossing,) = _sweep(rates).crossings("rps")
    assert crossing.interval is None
    (pair, *_) = ps.findings(group_results(_results(rates)), ROWS)
    assert "no interval: one repeat" in pair.sentence and "one repeat on a side" in pair.caveat


def test_a_lower_bound_is_left_out_and_named() -> None:
    results = _results(_rates(REST_RPS, CROSSING))
    for r in results:
        if r["scenario"]["target"] == "aiohttp-h1" and r["scenario"]["count"] == 1:
            r["service"]["usage"]["cpu_utilisation"] = 0.3
    groups = group_results(results)
    (sweep,) = ps.sweeps(groups, ROWS)
    assert [p.count for p in sweep.points["rps"]] == [10, 100, 1000]
    assert [label for label, _ in sweep.left_out] == ["aiohttp-h1 c1"]
    (pair, *_) = ps.findings(groups, ROWS)
    assert pair.caveat == "left out (lower bound or no successful repeat): aiohttp-h1 c1"
    assert "between 10 and 1,000 records" not in pair.sentence  # it crosses: no range sentence


def test_a_streaming_target_is_never_swept_against_rest() -> None:
    targets = ("aiohttp-h1", "grpc", "grpc-stream")
    overrides = Overrides(targets=targets, repeats=3)
    scenarios = expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides).scenarios
    rates = _rates(REST_RPS, CROSSING)
    results = [
        _result(s, rates["grpc" if s.target.name == "grpc-stream" else s.target.name, s.count][s.repeat - 1])
        for s in scenarios
    ]
    sweeps = ps.sweeps(group_results(results), ROWS)
    assert [(s.grpc_target, s.rest_target) for s in sweeps] == [("grpc", "aiohttp-h1")]


def test_a_run_with_one_count_has_no_payload_findings_or_section() -> None:
    rates = {k: v for k, v in _rates(REST_RPS, CROSSING).items() if k[1] == 100}
    groups = group_results(_results(rates))
    assert ps.findings(groups, ROWS) == [] and ps.section(groups, ROWS) == []


def test_body_sizes_cross_where_gzip_evens_them_out() -> None:
    raw, gzip, mixed = ps.size_findings(ROWS)
    assert "raw: 0.37x, 0.41x, 0.41x, 0.41x at 1, 10, 100, 1,000 records" in raw.sentence
    assert "protobuf smaller at every count, no crossing between 1 and 1,000 records" in raw.sentence
    # Compressed, the two come within a few percent from 10 records on, crossing 1 twice.
    assert gzip.sentence.count("of JSON (about") == 2
    assert "against gzip JSON" in mixed.sentence and "protobuf larger above" in mixed.sentence
    assert all(f.caveat == "" and f.question == "payload" for f in (raw, gzip, mixed))


def test_the_report_has_the_sweep_section_and_both_charts(tmp_path: Path) -> None:
    for result in _results(_rates(REST_RPS, CROSSING)):
        write_json_atomic(result_path(tmp_path, result["scenario_id"]), {"schema": RESULT_SCHEMA, **result})
    write_json_atomic(tmp_path / "manifest.json", {"run_id": "sweep", "git": {"sha": "abc"}, "host": {}})
    write_json_atomic(
        tmp_path / "payload.json", {"schema": PAYLOAD_SCHEMA, "rows": [asdict(r) for r in ROWS]}
    )
    md, page = write_report(tmp_path)
    text = md.read_text()
    assert "## Payload sweep: where protobuf pays off" in text
    assert (
        "![Payload sweep: req/s and CPU per request against response size](charts/payload_sweep.png)" in text
    )
    assert "charts/payload_crossover.png" in text
    assert (tmp_path / "charts" / "payload_sweep.png").stat().st_size > 10_000
    assert "Payload crossover" in page.read_text()


# Requests/s from 0.5 (4 requests in a window) to 100,000.
_POSITIVE = st.floats(min_value=0.5, max_value=1e5, allow_nan=False, allow_infinity=False)
_REPEATS = st.lists(_POSITIVE, min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_REPEATS, _REPEATS), min_size=4, max_size=4))
def test_no_printed_interval_of_a_positive_quantity_goes_below_zero(
    sides: list[tuple[list[float], list[float]]],
) -> None:
    points = [
        ps.Point(count, row.json_bytes, row.protobuf_bytes, ratio(grpc, rest))
        for count, row, (grpc, rest) in zip(COUNTS, ROWS, sides, strict=True)
    ]
    for c in ps.crossings(points):
        assert c.json_bytes > 0 and c.records > 0 and c.protobuf_bytes > 0
        if c.interval is not None:
            assert 0 < c.interval[0] <= c.json_bytes <= c.interval[1]
        text = ps._crossing(c)
        assert not re.search(r"-\s*\d", text), text
    for grpc, rest in sides:
        for values in (grpc, rest):
            assert (
                min(values) * (1 - 1e-9) <= payload_charts.geometric_mean(values) <= max(values) * (1 + 1e-9)
            )
    # The same values as the two targets' repeats (as many as the shortest side has), through findings.
    n = min(len(values) for side in sides for values in side)
    rates: dict[tuple[str, int], list[float]] = {}
    for count, (grpc, rest) in zip(COUNTS, sides, strict=True):
        rates["grpc", count], rates["aiohttp-h1", count] = grpc[:n], rest[:n]
    for finding in ps.findings(group_results(_results(rates)), ROWS):
        for bracket in re.findall(r"\[([^\]]*)\]", finding.sentence):
            assert not re.search(r"-\s*\d", bracket), finding.sentence
