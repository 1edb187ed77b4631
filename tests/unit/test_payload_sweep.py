"""Unit tests: the payload sweep (gRPC / REST by count, the cost model's answer) and its charts."""

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from labrunner.model import duet
from labrunner.model.matrix import Overrides, Scenario, expand, load_matrix
from labrunner.model.scenario import DEFAULT_SHAPE
from labrunner.report import findings, payload, payload_charts
from labrunner.report import payload_sweep as ps
from labrunner.report.build import write_report
from labrunner.report.compare import Group, group_results
from labrunner.report.document import to_markdown
from labrunner.report.findings import payload_sweep as sweep_findings
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.payload import SCHEMA as PAYLOAD_SCHEMA
from labrunner.report.payload import PayloadRow
from labrunner.report.sections import findings as findings_section
from labrunner.report.sections import payload_sweep as sweep_section
from labrunner.report.serialization import Case
from labrunner.results.result import parse_results
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
# The payload preset's: 300 where gRPC and Quart crossed in half the runs, beside REST's bend at 1,000.
PRESET_COUNTS = (1, 10, 100, 300, 1000)
DURATION_S = 8.0
QUOTA_USED = 0.9  # of the quarter profile: CPU-bound, so no group is a lower bound
# CPU-bound, a service spends its quota: CPU per request (ms) = this / req/s.
CPU_MS_PER_S = 0.25 * QUOTA_USED * 1000
# Factors on each repeat's req/s by count, different on the two sides so both have spread.
JITTER = {
    "grpc": {1: (1.0, 1.04, 0.96), 10: (0.97, 1.02, 1.01), 100: (1.03, 0.98, 0.99), 1000: (0.98, 1.01, 1.02)},
    "aiohttp-h1": {
        1: (0.97, 1.0, 1.03),
        10: (1.02, 0.96, 1.0),
        100: (0.99, 1.03, 0.98),
        1000: (1.01, 0.97, 1.0),
    },
}
# (a ms per request, b ms per record): gRPC dearer per request, cheaper per record; they meet at 40.
GRPC = (0.5, 0.002)
REST = (0.3, 0.007)

Rates = Mapping[tuple[str, int], Sequence[float]]  # (target, count) -> req/s of each repeat


def _findings(groups: Sequence[Group], cases: Sequence[Case] = ()) -> list[Finding]:
    return sweep_findings.findings(Evidence(tuple(groups), tuple(ROWS), tuple(cases)))


@cache
def _scenarios(
    targets: tuple[str, ...], repeats: int, shape: str = DEFAULT_SHAPE, direction: str = "download"
) -> tuple[Scenario, ...]:
    # The download sweep by default: an upload sweep is the same pairs in the other direction.
    # At a quarter CPU, the profile CPU_MS_PER_S and QUOTA_USED are of; at the counts JITTER has.
    overrides = Overrides(
        targets=targets,
        repeats=repeats,
        directions=(direction,),
        profiles=("quarter",),
        shapes=(shape,),
        counts=COUNTS,
    )
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


def _results(
    rates: Rates,
    targets: tuple[str, ...] = ("aiohttp-h1", "grpc"),
    shape: str = DEFAULT_SHAPE,
    direction: str = "download",
) -> list[dict[str, Any]]:
    repeats = len(next(iter(rates.values())))
    return [
        _result(s, rates[s.target.name, s.count][s.repeat - 1])
        for s in _scenarios(targets, repeats, shape, direction)
        if (s.target.name, s.count) in rates
    ]


def _rates(
    grpc: tuple[float, float] = GRPC, rest: tuple[float, float] = REST, counts: Sequence[int] = COUNTS
) -> dict[tuple[str, int], list[float]]:
    """Three repeats of grpc and aiohttp-h1 whose CPU per request is a + b·n ms, jittered."""
    rates: dict[tuple[str, int], list[float]] = {}
    for target, (fixed, per_record) in (("grpc", grpc), ("aiohttp-h1", rest)):
        for count in counts:
            rps = CPU_MS_PER_S / (fixed + per_record * count)
            rates[target, count] = [rps * j for j in JITTER[target][count]]
    return rates


def _sweep(rates: Rates, targets: tuple[str, ...] = ("aiohttp-h1", "grpc")) -> ps.Sweep:
    (sweep,) = ps.sweeps(group_results(parse_results(_results(rates, targets))), ROWS)
    return sweep


def _pair_finding(rates: Rates, cases: Sequence[Case] = ()) -> Finding:
    found = sweep_findings.findings(
        Evidence(tuple(group_results(parse_results(_results(rates)))), tuple(ROWS), tuple(cases))
    )
    (pair,) = [f for f in found if f.sentence.startswith("grpc vs aiohttp-h1, CPU per request: ")]
    return pair


def _encode_cases(codec: str, fixed_us: float, per_record_us: float) -> list[Case]:
    return [
        Case(codec, "encode", n, 100 * n, 100, 15, fixed_us + per_record_us * n, None, None, 0.0, 0.0)
        for n in COUNTS
    ]


# protobuf 0.3 µs and orjson 0.9 µs per record encoded.
CASES = (*_encode_cases("protobuf", 1.0, 0.3), *_encode_cases("orjson", 0.5, 0.9))


def test_the_payload_preset_sweeps_five_counts_over_rest_and_unary_grpc_with_and_without_tls() -> None:
    plan = expand(load_matrix(ROOT / "matrix.toml"), "local", "payload")
    assert {s.count for s in plan.scenarios} == set(PRESET_COUNTS)
    assert sorted({s.direction for s in plan.scenarios}) == ["download", "upload"]
    # An eighth of a CPU locally: two k6 on the other CPU outrun a duet's servers uploading 1,000 records.
    assert {s.profile.name for s in plan.scenarios} == {"eighth"}
    assert plan.duet_questions == ("gRPC vs REST",)  # the sweep's pairs only
    assert {s.load_model.executor for s in plan.scenarios} == {"constant-vus"}
    targets = {s.target.name: s.target for s in plan.scenarios}
    assert {t.service for t in targets.values()} == {"rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio"}
    for service in ("rest_aiohttp", "rest_quart", "rest_granian", "grpc_aio"):
        assert {t.tls for t in targets.values() if t.service == service} == {True, False}
    assert all(t.script != ps.STREAM_SCRIPT for t in targets.values())
    assert len(plan.scenarios) == 8 * 5 * 2 * 3  # targets x counts x directions x repeats


def test_the_sweep_fits_both_targets_and_puts_the_crossover_between_10_and_100_records() -> None:
    sweep = _sweep(_rates())
    assert sweep.grpc_model is not None and sweep.rest_model is not None
    for model, (fixed, per_record) in ((sweep.grpc_model, GRPC), (sweep.rest_model, REST)):
        # Repeats' jitter and whole requests move the fit by a few percent.
        assert model.line.fixed.value == pytest.approx(fixed, rel=0.05)
        assert model.line.per_record.value == pytest.approx(per_record, rel=0.05)
    crossover = sweep.crossover
    assert crossover is not None and crossover.records is not None and crossover.interval is not None
    assert crossover.records == pytest.approx(40, rel=0.1)
    assert 10 < crossover.interval[0] < crossover.records < crossover.interval[1] < 100
    # The measured ratios stay, count by count: gRPC dearer at 1 record, cheaper at 1,000.
    cpu = sweep.points["cpu_per_1k"]
    assert [p.count for p in cpu] == list(COUNTS)
    assert cpu[0].ratio.estimate == pytest.approx(0.502 / 0.307, rel=0.05)
    assert cpu[-1].ratio.estimate == pytest.approx(2.5 / 7.3, rel=0.05)


def test_the_finding_names_the_crossover_its_interval_the_costs_and_what_was_held_fixed() -> None:
    pair = _pair_finding(_rates())
    assert pair.question == "payload"
    assert re.fullmatch(
        r"grpc vs aiohttp-h1, CPU per request: crosses at \d\d records \[\d\d, \d\d\], gRPC cheaper above; "
        r"gRPC \+0\.2\d ms/request, -5\.\d µs/record\.",
        pair.sentence,
    ), pair.sentence
    assert len(pair.sentence) < 200
    assert pair.held_fixed == "quarter profile, build, closed (10 VUs), loopback, no TLS"
    assert pair.caveat == ""
    assert pair.effect == pytest.approx(
        math.log(7.3 / 2.5), rel=0.05
    )  # the largest measured ratio either way


def test_without_a_crossover_the_finding_says_why() -> None:
    pair = _pair_finding(_rates(grpc=(0.2, 0.002)))
    assert (
        "CPU per request: no crossover, gRPC costs less per record and per request (lines meet at -"
        in pair.sentence
    )


def test_per_record_costs_equal_within_the_noise_leave_the_crossover_unbounded() -> None:
    pair = _pair_finding(_rates(grpc=(0.5, 0.007)))
    assert (
        "CPU per request: no crossover resolved, per-record costs not told apart (interval unbounded;"
        in pair.sentence
    )


def test_one_repeat_at_two_counts_gives_a_crossover_without_an_interval_and_no_check() -> None:
    rates = {k: v[:1] for k, v in _rates(counts=(10, 100)).items()}
    found = sweep_findings.findings(
        Evidence(tuple(group_results(parse_results(_results(rates)))), tuple(ROWS), tuple(()))
    )
    assert "(no interval: a line through two points)" in found[0].sentence
    assert "cost model not checked: a held-out count needs three or more counts." in [
        f.sentence for f in found
    ]


def test_the_model_check_is_a_finding() -> None:
    found = sweep_findings.findings(
        Evidence(tuple(group_results(parse_results(_results(_rates())))), tuple(ROWS), tuple(()))
    )
    (check,) = [f for f in found if f.sentence.startswith("cost model check")]
    # Affine inputs: each fit without 1,000 records predicts it within the repeats' jitter.
    assert re.fullmatch(
        r"cost model check: each target's fit without its largest count predicts it within \d\.\d%"
        r" \(2 targets; largest error (grpc|aiohttp-h1) [+-]\d\.\d% at 1,000 records\)\.",
        check.sentence,
    ), check.sentence


def test_with_the_serialization_benchmark_a_finding_splits_the_per_record_difference() -> None:
    groups = group_results(parse_results(_results(_rates())))
    assert not [f for f in _findings(groups, ()) if "per record:" in f.sentence]
    (split,) = [f for f in _findings(groups, CASES) if "per record:" in f.sentence]
    match = re.fullmatch(
        r"grpc vs aiohttp-h1, per record: gRPC (-5\.\d\d) \[-\d\.\d\d, -\d\.\d\d\] µs against REST; "
        r"encoding alone -0\.60 µs \(protobuf 0\.30, orjson 0\.90\): "
        r"(\d+)% of it the format, the rest the server\.",
        split.sentence,
    )
    assert match, split.sentence
    assert int(match[2]) == round(100 * 0.6 / -float(match[1]))


def test_the_section_shows_the_cost_model_the_crossover_and_the_measured_ratios() -> None:
    groups = group_results(parse_results(_results(_rates())))
    text = to_markdown(sweep_section.section(groups, ROWS, CASES), Path())
    assert "Cost model, quarter profile, build, closed (10 VUs), loopback:" in text
    (grpc_row,) = [line for line in text.splitlines() if line.startswith("| grpc | 1, 10, 100, 1,000 |")]
    # a in ms, b in µs per record, each with its interval; the encoding's b is exact here.
    assert re.search(r"\| 0\.5\d\d \[0\.\d{3}, 0\.\d{3}\] \| [12]\.\d\d \[[\d.]+, [\d.]+\] \|", grpc_row), (
        grpc_row
    )
    assert "| 0.30 [0.30, 0.30] (protobuf) |" in grpc_row
    assert re.search(r"\| 1,000: 2\.\d{3} / 2\.\d{3} \([+-]\d\.\d%\) \| - \|$", grpc_row), grpc_row
    assert re.search(
        r"\| grpc \| aiohttp-h1 \| crosses at \d\d records \[\d\d, \d\d\], gRPC cheaper above \|", text
    )
    (sweep,) = ps.sweeps(groups, ROWS)
    assert sweep.grpc_model is not None and sweep.rest_model is not None
    per_record_us = 1000 * (sweep.grpc_model.line.per_record.value - sweep.rest_model.line.per_record.value)
    assert f"| -0.60 µs ({-0.6 / per_record_us:.0%} of it) |" in text
    assert "| grpc | aiohttp-h1 | 1 | 193 B | 72 B |" in text  # the measured ratios by count
    assert sweep_section.NO_BENCHMARK in to_markdown(sweep_section.section(groups, ROWS), Path())


def test_a_lower_bound_is_left_out_of_the_ratios_but_kept_in_the_fit_and_named() -> None:
    results = _results(_rates())
    for r in results:
        if r["scenario"]["target"] == "aiohttp-h1" and r["scenario"]["count"] == 1:
            r["service"]["usage"]["cpu_utilisation"] = 0.3
    groups = group_results(parse_results(results))
    (sweep,) = ps.sweeps(groups, ROWS)
    assert [p.count for p in sweep.points["rps"]] == [10, 100, 1000]
    assert [label for label, _ in sweep.left_out] == ["aiohttp-h1 c1"]
    assert sweep.rest_model is not None and sweep.rest_model.counts == COUNTS
    (pair, *_) = _findings(groups, ())
    assert pair.caveat == "below 50% of the quota, idle CPU in the cost: aiohttp-h1 c1 at 30%"
    assert "crosses at" in pair.sentence


def test_a_streaming_target_is_never_swept_against_rest() -> None:
    targets = ("aiohttp-h1", "grpc", "grpc-stream")
    overrides = Overrides(targets=targets, repeats=3, counts=COUNTS)
    scenarios = expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides).scenarios
    rates = _rates()
    results = [
        _result(s, rates["grpc" if s.target.name == "grpc-stream" else s.target.name, s.count][s.repeat - 1])
        for s in scenarios
    ]
    sweeps = ps.sweeps(group_results(parse_results(results)), ROWS)
    # One sweep per direction, each unary gRPC against REST.
    assert [(s.grpc_target, s.rest_target, s.grpc[0].direction) for s in sweeps] == [
        ("grpc", "aiohttp-h1", "download"),
        ("grpc", "aiohttp-h1", "upload"),
    ]


def test_a_run_with_one_count_has_no_payload_findings_or_section() -> None:
    rates = {k: v for k, v in _rates().items() if k[1] == 100}
    groups = group_results(parse_results(_results(rates)))
    assert ps.sweeps(groups, ROWS) == []


def test_body_sizes_cross_where_gzip_evens_them_out() -> None:
    raw, gzip, mixed = sweep_findings.size_findings(ROWS)
    assert "raw: 0.37x, 0.41x, 0.41x, 0.41x at 1, 10, 100, 1,000 records" in raw.sentence
    assert "protobuf smaller at every count, no crossing between 1 and 1,000 records" in raw.sentence
    # Compressed, the two come within a few percent from 10 records on, crossing 1 twice.
    assert gzip.sentence.count("of JSON (about") == 2
    # Raw protobuf against gzip JSON, linear in records between 1 and 10: 72 - 165 = -93 and
    # 747 - 607 = 140 meet at t = 93 / 233, 1 + 9t = 4.6 records, 193 + 1,643t = 849 B of JSON.
    assert "crosses 1 at 849 B of JSON (about 5 records; protobuf larger above)" in mixed.sentence
    assert all(f.caveat == "" and f.question == "payload" for f in (raw, gzip, mixed))
    (crossing,) = sweep_findings.size_crossings(ROWS, "protobuf_bytes", "json_gzip_bytes")
    assert crossing.records == pytest.approx(1 + 9 * 93 / 233)


def test_the_report_has_the_sweep_section_and_both_charts(tmp_path: Path) -> None:
    for result in _results(_rates()):
        write_json_atomic(result_path(tmp_path, result["scenario_id"]), {"schema": RESULT_SCHEMA, **result})
    write_json_atomic(tmp_path / "manifest.json", {"run_id": "sweep", "git": {"sha": "abc"}, "host": {}})
    write_json_atomic(
        tmp_path / "payload.json", {"schema": PAYLOAD_SCHEMA, "rows": [asdict(r) for r in ROWS]}
    )
    md, page = write_report(tmp_path)
    text = md.read_text()
    assert "## Payload sweep: where protobuf pays off" in text
    assert "Cost model, quarter profile, build, closed (10 VUs), loopback:" in text
    assert (
        "![Payload sweep: req/s and CPU per request against response size](charts/payload_sweep.png)" in text
    )
    assert "![Payload crossover: gRPC / REST against records](charts/payload_crossover.png)" in text
    assert (tmp_path / "charts" / "payload_sweep.png").stat().st_size > 10_000
    assert (tmp_path / "charts" / "payload_crossover.png").stat().st_size > 10_000
    assert "Payload crossover" in page.read_text()


# Requests/s from 0.5 (4 requests in a window) to 100,000.
_POSITIVE = st.floats(min_value=0.5, max_value=1e5, allow_nan=False, allow_infinity=False)
_REPEATS = st.lists(_POSITIVE, min_size=1, max_size=5)
_CROSSES = re.compile(r"crosses at ([\d,.]+) records \[(-?[\d,.]+), (-?[\d,.]+)\]")


# The module's own example: CPU per request a + b·n, jittered, the lines meeting at 40 records.
_CROSSING = [(_rates()["grpc", count], _rates()["aiohttp-h1", count]) for count in COUNTS]
_PARALLEL = [([100.0, 110.0], [200.0, 190.0])] * 4  # the same ratio at every count: no crossover


@st.composite
def _linear_sides(draw: st.DrawFn) -> list[tuple[list[float], list[float]]]:
    """Repeats of two servers whose CPU per request is a + b·n ms, each repeat within 10%: random
    repeats hardly ever cross, these often do, so both branches below are exercised."""
    fixed, per_record = st.floats(0.05, 1.0), st.floats(0.0005, 0.01)
    lines = [(draw(fixed), draw(per_record)) for _ in range(2)]
    repeats = draw(st.integers(2, 4))
    factors = st.lists(st.floats(0.9, 1.1), min_size=repeats, max_size=repeats)
    sides = []
    for count in COUNTS:
        grpc, rest = ([CPU_MS_PER_S / (a + b * count) * f for f in draw(factors)] for a, b in lines)
        sides.append((grpc, rest))
    return sides


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_REPEATS, _REPEATS), min_size=4, max_size=4) | _linear_sides())
@example(_CROSSING)
@example(_PARALLEL)
def test_any_repeats_give_a_finding_whose_crossover_lies_in_its_interval(
    sides: list[tuple[list[float], list[float]]],
) -> None:
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
    crossover = _sweep(rates).crossover
    sentence = _pair_finding(rates).sentence
    assert crossover is not None, sentence
    if crossover.interval is not None:  # Fieller's interval, when bounded, holds the estimate
        assert crossover.records is not None
        assert crossover.interval[0] <= crossover.records <= crossover.interval[1], crossover
    crosses = _CROSSES.findall(sentence)
    if crossover.resolved is None or crossover.reason:
        assert "CPU per request: no crossover" in sentence and not crosses, sentence
        return
    assert "CPU per request: crosses at" in sentence, sentence
    if crossover.interval is None:  # a line through two points: no interval to print
        assert "(no interval: a line through two points)" in sentence, sentence
        return
    # Printed rounded: within a record (or a tenth of one below 10) of the interval.
    ((estimate, low, high),) = crosses
    value, ends = float(estimate.replace(",", "")), [float(v.replace(",", "")) for v in (low, high)]
    assert ends[0] - 1 <= value <= ends[1] + 1, sentence
    assert value == pytest.approx(crossover.records, abs=0.051 if crossover.records < 10 else 0.51)


def test_a_shape_is_swept_on_its_own_bodies_and_benchmark_and_told_apart_from_cars(tmp_path: Path) -> None:
    cars = _results(_rates())
    numeric = _results(_rates(), shape="numeric")
    groups = group_results(parse_results([*cars, *numeric]))
    by_shape = {s.shape: s for s in ps.sweeps(groups, ROWS)}
    assert set(by_shape) == {DEFAULT_SHAPE, "numeric"}
    sizes = {r.count: r.json_bytes for r in payload.measure(COUNTS, "numeric")}
    assert [p.json_bytes for p in by_shape["numeric"].points["rps"]] == [sizes[n] for n in COUNTS]
    assert [p.json_bytes for p in by_shape[DEFAULT_SHAPE].points["rps"]] == [JSON_BYTES[n] for n in COUNTS]
    assert (
        by_shape["numeric"].scenario.endswith(", numeric records")
        and by_shape["numeric"].variant == " (numeric)"
    )
    assert by_shape[DEFAULT_SHAPE].variant == ""
    # One cost model per target and shape, and the format split only where the benchmark ran the shape.
    assert len(ps.models(list(by_shape.values()))) == 4
    splits = [f.sentence for f in _findings(groups, CASES) if "per record:" in f.sentence]
    assert len(splits) == 1 and "numeric" not in splits[0]
    # Where the answer changes with the shape: one sentence per pair over both shapes (same costs here).
    (shapes_finding,) = [f for f in _findings(groups) if "per record by shape:" in f.sentence]
    assert re.fullmatch(
        r"grpc vs aiohttp-h1, per record by shape: gRPC "
        r"(-5\.\d \[-\d\.\d, -\d\.\d\] µs \((cars|numeric)\)(, )?){2} against REST\.",
        shapes_finding.sentence,
    ), shapes_finding.sentence
    assert "(cars)" in shapes_finding.sentence and "(numeric)" in shapes_finding.sentence
    numeric_cases = [replace(c, shape="numeric") for c in CASES]
    assert len([f for f in _findings(groups, (*CASES, *numeric_cases)) if "per record:" in f.sentence]) == 2
    text = to_markdown(sweep_section.section(groups, ROWS, CASES), Path())
    assert "Cost model, quarter profile, build, closed (10 VUs), loopback, numeric records:" in text
    assert "| grpc | aiohttp-h1 (numeric) | 1,000 |" in text
    # The charts: one row of panels per shape, each ticked with its own records' bodies.
    assert payload_charts.sweep(groups, ROWS, tmp_path / "sweep.png") is not None
    assert payload_charts.crossover(list(by_shape.values()), tmp_path / "crossover.png") is not None


def test_a_count_the_payload_table_lacks_is_ticked_with_its_own_json_body() -> None:
    # payload.json holds 1, 10, 100 and 1,000 records; the payload preset sweeps 300 too. Its tick
    # once read "300 rec" alone between "18.3 KB / 100 rec" and "183 KB / 1,000 rec". Here the table
    # lacks 100 records: the crossover chart ticks it with what the sweep measured.
    without_100 = tuple(r for r in ROWS if r.count != 100)
    groups = group_results(parse_results(_results(_rates())))
    sizes = payload_charts.tick_sizes(ps.sweeps(groups, without_100))
    assert sizes == {**JSON_BYTES, 100: payload.measure([100])[0].json_bytes}
    numeric = group_results(parse_results(_results(_rates(), shape="numeric")))
    by_count = {r.count: r.json_bytes for r in payload.measure(COUNTS, "numeric")}
    assert payload_charts.tick_sizes(ps.sweeps(numeric, without_100)) == by_count


def test_the_forest_plot_labels_each_pair_by_what_tells_it_from_the_others() -> None:
    groups = group_results(parse_results([*_results(_rates()), *_results(_rates(), shape="numeric")]))
    labels = [label for label, _ in findings_section.forest_rows(groups)]
    assert len(labels) == len(set(labels)) == 2 * len(COUNTS)  # one pair per count and shape
    assert "grpc / aiohttp-h1 (c10)" in labels and "grpc / aiohttp-h1 (c10, numeric)" in labels
    one_count = [g for g in groups if g.count == 100 and g.shape == DEFAULT_SHAPE]
    assert [label for label, _ in findings_section.forest_rows(one_count)] == ["grpc / aiohttp-h1"]


def test_the_sweep_chart_draws_each_direction_and_shape_in_its_own_row() -> None:
    groups = group_results(
        parse_results(
            [
                *_results(_rates()),
                *_results(_rates(), direction="upload"),
                *_results(_rates(), shape="numeric"),
            ]
        )
    )
    facets, sizes = payload_charts.sweep_facets(groups, ROWS)
    assert [title for title, _ in facets] == [
        "quarter, build, closed, loopback",
        "quarter, uploads, closed, loopback",
        "quarter, build, closed, loopback, numeric",
    ]
    for (_, shape), members in facets.items():  # one line per target: one group per target and count
        assert len({(g.target, g.count) for g in members}) == len(members)
        assert {g.shape for g in members} == {shape}
    assert sizes["numeric"] == {r.count: r.json_bytes for r in payload.measure(COUNTS, "numeric")}


def test_the_run_measures_body_sizes_only_when_it_swept_counts_and_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured: list[int] = []

    def measure() -> tuple[PayloadRow, ...]:
        measured.append(1)
        return ROWS

    monkeypatch.setattr(payload, "measure", measure)
    swept = group_results(parse_results(_results(_rates(counts=(1, 10)))))
    from_the_pool = findings.for_run(swept, "payload")
    assert measured == [1]
    assert findings.for_run(swept, "payload", ROWS) == from_the_pool and measured == [1]
    one_count = group_results(parse_results(_results(_rates(counts=(10,)))))
    findings.for_run(one_count, "payload")
    assert measured == [1], "a run of one count needs no body sizes"


def test_the_runs_body_sizes_and_benchmark_reach_the_findings() -> None:
    groups = group_results(parse_results(_results(_rates())))
    given = findings.for_run(groups, "payload", ROWS)
    doubled = tuple(
        replace(r, json_bytes=2 * r.json_bytes, json_gzip_bytes=2 * r.json_gzip_bytes) for r in ROWS
    )
    assert findings.for_run(groups, "payload", doubled) != given
    assert not [f for f in given if "per record:" in f.sentence]
    assert [f for f in findings.for_run(groups, "payload", ROWS, CASES) if "per record:" in f.sentence]


def test_the_runs_own_preset_is_never_named_as_not_asked() -> None:
    one_count = group_results(parse_results(_results(_rates(counts=(10,)))))
    unasked = {f.sentence for f in findings.for_run(one_count, None)} - {
        f.sentence for f in findings.for_run(one_count, "payload")
    }
    assert len(unasked) == 1 and "payload" in unasked.pop()


def test_a_counts_measured_ratio_pairs_the_rounds_so_a_slow_round_for_both_cancels() -> None:
    # Both sides slowed alike round by round (a duet's blocks: ±20%), gRPC at 0.4x aiohttp's req/s at
    # 10 records and 0.8x at 100 in every round: paired by round each ratio is exact, where Welch's
    # test over the repeats would see the host's ±20%.
    host = (1.0, 0.8, 1.2)
    served = {
        ("grpc", 10): 400.0,
        ("aiohttp-h1", 10): 1000.0,
        ("grpc", 100): 320.0,
        ("aiohttp-h1", 100): 400.0,
    }
    points = _sweep({key: [rps * h for h in host] for key, rps in served.items()}).points["rps"]
    assert [(p.count, p.ratio.estimate) for p in points] == [
        (10, pytest.approx(0.4)),
        (100, pytest.approx(0.8)),
    ]
    assert all(p.ratio.low == pytest.approx(p.ratio.estimate) == p.ratio.high for p in points)


# CPU per request (a ms, b ms per record) of the three targets of a duet payload run.
DUET_COSTS = {"grpc": (0.5, 0.002), "aiohttp-h1": (0.3, 0.007), "quart-h1": (0.6, 0.003)}


def _duet_sweeps() -> list[ps.Sweep]:
    """The payload preset's duet plan for aiohttp-h1, quart-h1 and grpc, downloads, at COUNTS, 3 blocks: every
    block at its own host speed (both sides alike), none the same as another block's."""
    overrides = Overrides(targets=("aiohttp-h1", "quart-h1", "grpc"), directions=("download",), counts=COUNTS)
    plan = duet.plan_duets(
        expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides), duet.AUTO
    )

    def block(s: Scenario) -> tuple[int, str, int]:
        """The block s ran in: its count, the two targets (one in the A/A control) and its round."""
        assert s.duet is not None
        return s.count, "+".join(sorted({s.target.name, s.duet.partner})), s.repeat

    blocks = sorted({block(s) for s in plan.scenarios})
    # 0.95x to 1.05x the host's speed: enough to tell any two blocks apart, little enough for the lines
    # fitted apart to pass their held-out check, so the crossover is claimed.
    host = {b: 1 + 0.025 * (i % 5 - 2) + 0.001 * i for i, b in enumerate(blocks)}
    results = []
    for s in plan.scenarios:
        assert s.duet is not None
        fixed, per_record = DUET_COSTS[s.target.name]
        requests = 1000
        cost_ms = (fixed + per_record * s.count) * host[block(s)]
        results.append(
            ok_result(
                s,
                requests=requests,
                rps=requests / DURATION_S,
                latency_ms={"avg": 10.0, "p50": 9.0, "p90": 12.0, "p95": 14.0, "p99": 20.0},
                received_bytes=requests * JSON_BYTES[s.count],
                window_s=DURATION_S,
                cpu_seconds=cost_ms * requests / 1000,
                quota_used=QUOTA_USED,
            )
        )
    return ps.sweeps(group_results(parse_results(results)), ROWS)


def test_a_duet_sweep_pairs_the_groups_that_ran_beside_each_other() -> None:
    # Each of grpc's groups at a count ran beside one REST server, and quart-h1 has an A/A control's
    # group too: a pair's rounds are the blocks its two sides shared, so every ratio is exact.
    sweeps = {s.rest_target: s for s in _duet_sweeps()}
    assert set(sweeps) == {"aiohttp-h1", "quart-h1"}
    for rest, s in sweeps.items():
        assert {g.partner for g in s.grpc} == {rest} and {g.partner for g in s.rest} == {"grpc"}
        g_fixed, g_per_record = DUET_COSTS["grpc"]
        r_fixed, r_per_record = DUET_COSTS[rest]
        for p in s.points["cpu_per_1k"]:
            exact = (g_fixed + g_per_record * p.count) / (r_fixed + r_per_record * p.count)
            assert p.ratio.estimate == pytest.approx(exact, rel=1e-6)
            assert p.ratio.low == pytest.approx(exact, rel=1e-6) and p.ratio.high == pytest.approx(
                exact, rel=1e-6
            )
    # gRPC and Quart's lines meet at (0.5 - 0.6) / (0.003 - 0.002) = -100 records: gRPC costs less at
    # every count; gRPC and aiohttp's at (0.5 - 0.3) / (0.007 - 0.002) = 40, from the paired ratios.
    crossing = sweeps["aiohttp-h1"].crossover
    assert crossing is not None and crossing.paired is not None
    assert crossing.records == pytest.approx(40, rel=1e-6)


def test_the_cost_table_fits_grpc_over_its_blocks_beside_every_rest_server() -> None:
    fitted = {m.target: m for m in ps.models(_duet_sweeps())}
    assert len(fitted["grpc"].points) == 2 * 4 * 3  # two partners, four counts, three blocks each
    assert len(fitted["aiohttp-h1"].points) == 4 * 3
