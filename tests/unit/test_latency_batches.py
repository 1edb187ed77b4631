"""Latency batches: an open model's window cut into consecutive batches of equal count, each one's
percentiles a value, so a latency ratio from one window per side has batches - 1 degrees of freedom a
side; a batch too small for a percentile gives it none."""

import dataclasses
import math
from typing import Any

import pytest
from labrunner.report.compare import Comparison, compare_groups, group_results
from labrunner.report.findings import finding, pairs
from labrunner.report.stats import Ratio
from labrunner.results.result import parse_results
from labrunner.results.trust import rounds_needed
from labrunner.run.k6_stats import LATENCY_BATCHES, batch_percentiles, percentile


def test_batches_are_consecutive_runs_of_equal_count() -> None:
    samples = [float(v) for v in range(1, 103)]  # 102 samples: 5 batches of 20, the last 2 left out
    batches = batch_percentiles(samples)
    assert len(batches) == LATENCY_BATCHES
    assert [b["n"] for b in batches] == [20.0] * 5
    assert batches[0]["p50"] == percentile([float(v) for v in range(1, 21)], 0.5) == 10.5
    assert batches[4]["p50"] == 90.5
    assert batch_percentiles([1.0, 2.0, 3.0]) == ()  # fewer samples than batches


def _open_result(target: str, service: str, batches: list[dict[str, float]]) -> dict[str, Any]:
    p50s = sorted(b["p50"] for b in batches)
    return {
        "scenario_id": f"{target}.quarter.c100.loaded-25pct.r1",
        "status": "ok",
        "scenario": {
            "group": f"{target}.quarter.c100.loaded-25pct",
            "target": target,
            "service": service,
            "script": "k6/rest.js",
            "protocol": "http1.1",
            "tls": False,
            "env": {},
            "profile": {"name": "quarter", "cpus": 0.25, "memory_bytes": 2**29},
            "count": 100,
            "response_model": "build",
            "network": {"name": "loopback"},
            "load_model": {"name": "loaded-25pct", "executor": "constant-arrival-rate", "rate": 100},
            "repeat": 1,
            "duration_s": 7.0,
        },
        "k6": {
            "cpu_utilisation": 0.2,
            "metrics": {
                "requests": 1000,
                "requests_per_second": 100.0,
                "errors": 0,
                "latency_count": 1000,
                "latency_ms": {"p50": p50s[len(p50s) // 2], "p99": 40.0},
            },
            "latency_batches": batches,
        },
        "service": {"usage": {"cpu_seconds": 2.0, "cpu_utilisation": 0.5}},
        "suspect": [],
    }


def _batches(p50s: list[float], n: float = 200.0) -> list[dict[str, float]]:
    return [{"n": n, "p50": v, "p99": 4 * v} for v in p50s]


def test_one_window_a_side_gives_a_latency_ratio_with_an_interval() -> None:
    fast = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0]))
    slow = _open_result("quart-h1", "rest_quart", _batches([10.0, 10.5, 9.8, 10.2, 10.1]))
    [comparison] = compare_groups(group_results(parse_results([fast, slow])))
    p50 = comparison.ratios["p50"]
    assert p50.estimate == pytest.approx(0.5, rel=0.02)
    assert p50.low is not None and p50.high is not None and p50.low < 0.5 < p50.high and p50.significant
    # 200 samples a batch support p50 (10 beyond it), not p99 (1,000 needed): no batch ratio for p99.
    assert comparison.candidate.batches("p99") == []
    assert comparison.ratios["p99"].low is None  # one repeat a side, nothing to give it an interval
    # The group's centre is the batches' too: one centre per group, the one its ratio is made of.
    summary = comparison.baseline.summary("p50")
    assert summary is not None and summary.n == LATENCY_BATCHES


def test_batches_that_support_p99_give_it_a_ratio() -> None:
    fast = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0], n=1000))
    slow = _open_result("quart-h1", "rest_quart", _batches([10.0, 10.5, 9.8, 10.2, 10.1], n=1000))
    [comparison] = compare_groups(group_results(parse_results([fast, slow])))
    p99 = comparison.ratios["p99"]
    assert p99.estimate == pytest.approx(0.5, rel=0.02) and p99.low is not None


def test_a_tail_the_batches_cannot_hold_says_what_it_needs() -> None:
    fast = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0]))
    slow = _open_result("quart-h1", "rest_quart", _batches([10.0, 10.5, 9.8, 10.2, 10.1]))
    [comparison] = compare_groups(group_results(parse_results([fast, slow])))
    assert pairs._short_batches(comparison)
    # 1,000 a batch at 200 per 7 s window's fifth: 35 s windows, which the note asks for.
    assert pairs._conditions(comparison.candidate).alone.endswith(
        ", 200 samples a batch, p99 needs 35 s windows (--duration)"
    )
    # A result written before its window was recorded: the samples alone.
    old = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0]))
    del old["scenario"]["duration_s"]
    [before] = group_results(parse_results([old]))
    assert pairs._conditions(before).alone.endswith(", 200 samples a batch")


def test_batches_that_disagree_say_the_latency_moved_not_that_rounds_are_missing() -> None:
    steady = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0]))
    queue = _open_result("quart-h1", "rest_quart", _batches([5.0, 20.0, 80.0, 300.0, 900.0]))
    [comparison] = compare_groups(group_results(parse_results([steady, queue])))
    p50 = comparison.ratios["p50"]
    assert p50.rounds is None
    assert finding.glance(p50, "p50", "a vs b")[1][0].alone == (
        "p50 —: too wide: latency moved from batch to batch in its window (a queue near the quota)"
    )
    # With what a longer window would decide, the note says it for the pair (the done-when's "or
    # saying what it needs").
    needs = pairs._to_decide(p50, comparison.candidate)
    assert needs.startswith("about ") and needs.endswith(" s windows to decide (--duration)"), needs
    assert finding.glance(p50, "p50", "a vs b", undecided=needs)[1][0].alone == (
        "p50 —: a vs b: too wide: latency moved from batch to batch in its window (a queue near the "
        f"quota), {needs}"
    )
    # A ratio far from 1 whose batches spread too far to show: the window that brings its interval
    # within 3x (where it excludes 1 too), not none.
    far = _open_result("aiohttp-h1", "rest_aiohttp", _batches([1.0, 1.1, 0.9, 1.0, 1.05]))
    [far_off] = compare_groups(group_results(parse_results([far, queue])))
    wide = far_off.ratios["p50"]
    assert wide.low is not None and wide.high is not None and wide.high / wide.low > 3 and wide.low < 0.5
    assert pairs._to_decide(wide, far_off.candidate).endswith(" s windows to decide (--duration)")


def _closed_result(target: str, service: str, rps: float) -> dict[str, Any]:
    result = _open_result(target, service, _batches([5.0] * LATENCY_BATCHES))
    result["scenario_id"] = f"{target}.quarter.c100.closed.r1"
    result["scenario"] |= {
        "group": f"{target}.quarter.c100.closed",
        "load_model": {"name": "closed", "executor": "constant-vus"},
    }
    result["k6"]["metrics"]["requests_per_second"] = rps
    return result


@pytest.mark.parametrize("per_batch", [200.0, 1000.0])
def test_the_pairs_line_says_p99_needs_longer_windows_only_when_its_batches_are_short(
    per_batch: float,
) -> None:
    results = [
        _closed_result("aiohttp-h1", "rest_aiohttp", 400.0),
        _closed_result("quart-h1", "rest_quart", 200.0),
        _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 5.2, 4.9, 5.1, 5.0], n=per_batch)),
        _open_result("quart-h1", "rest_quart", _batches([10.0, 10.5, 9.8, 10.2, 10.1], n=per_batch)),
    ]
    [line] = pairs.findings(finding.Evidence(tuple(group_results(parse_results(results))), (), ()))
    short = finding.Note(pairs._P99_SHORT, rank=finding.VERDICT)
    p50 = "p50 0.50x [0.48, 0.52]"  # 200 samples a batch hold p50: its ratio either way
    if per_batch < 1000:
        assert line.sentence.endswith(f", {p50}, p99 —"), line.sentence
        assert short in line.notes, line.notes
    else:
        assert line.sentence.endswith(f", {p50}, p99 0.50x [0.48, 0.52]"), line.sentence
        assert short not in line.notes, line.notes
        # 1,000 samples a batch are what p99 needs: the sides' notes say nothing of batches.
        assert {n.alone for n in line.notes if n.subject.endswith("at 100 req/s")} == {
            "aiohttp-h1 at 100 req/s: CPU 50%",
            "quart-h1 at 100 req/s: CPU 50%",
        }


def test_a_side_that_served_under_its_offered_rate_is_said_not_to_carry_it() -> None:
    carried = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0] * LATENCY_BATCHES))
    queued = _open_result("quart-h1", "rest_quart", _batches([5.0] * LATENCY_BATCHES))
    queued["k6"]["metrics"]["requests_per_second"] = 50.0  # offered 100 req/s
    closed = _closed_result("grpc", "grpc_aio", 300.0)
    by_target = {g.target: g for g in group_results(parse_results([carried, queued, closed]))}
    assert pairs._offered_rate(by_target["aiohttp-h1"]) == 100
    assert pairs._not_carried(by_target["aiohttp-h1"]) is None
    assert pairs._not_carried(by_target["quart-h1"]) == finding.Note(
        "did not carry it (served 50): its latency is a queue's", "quart-h1 at 100 req/s", finding.VERDICT
    )
    # A closed model offers no rate: nothing to carry. Nor does a group without results.
    assert pairs._offered_rate(by_target["grpc"]) is None and pairs._not_carried(by_target["grpc"]) is None
    assert pairs._offered_rate(dataclasses.replace(by_target["quart-h1"], results=())) is None
    assert pairs._rate(Comparison("k", by_target["grpc"], by_target["grpc"], {})) == 0


def test_a_duets_suspect_repeats_are_said_of_the_pair() -> None:
    first, second = _closed_result("grpc", "grpc_aio", 300.0), _closed_result("grpc", "grpc_aio", 310.0)
    second["scenario_id"] = "grpc.quarter.c100.closed.r2"
    second["scenario"]["repeat"] = 2
    second["suspect"] = ["others busy"]
    [group] = group_results(parse_results([first, second]))
    assert pairs._saturated_suspect(
        dataclasses.replace(group, partner="aiohttp-h1"), "grpc vs aiohttp-h1"
    ) == (
        finding.Note("1 of 2 repeats of grpc suspect, see summary.md", "grpc vs aiohttp-h1", finding.SUSPECT)
    )
    assert (
        pairs._saturated_suspect(
            dataclasses.replace(group, partner="aiohttp-h1", results=(group.results[0],)), "p"
        )
        is None
    )


def test_an_inconclusive_latency_ratio_says_what_would_decide_it() -> None:
    # p50s about 8% apart whose batches spread: an interval across 1, wider than ±10%.
    fast = _open_result("aiohttp-h1", "rest_aiohttp", _batches([5.0, 6.0, 4.4, 5.6, 5.1]))
    slow = _open_result("quart-h1", "rest_quart", _batches([5.6, 6.6, 4.8, 6.3, 5.5]))
    [comparison] = compare_groups(group_results(parse_results([fast, slow])))
    p50 = comparison.ratios["p50"]
    assert p50.low is not None and p50.high is not None and p50.rounds is None
    assert p50.low < 1 < p50.high and not p50.significant and not p50.equivalent
    # Deciding takes an interval within ln(1/0.91) of its centre (to exclude 1): (half / that)² the
    # 7 s window, rounded up to 5 s.
    half = max(math.log(p50.high / p50.estimate), math.log(p50.estimate / p50.low))
    seconds = 5 * math.ceil(7 * (half / abs(math.log(p50.estimate))) ** 2 / 5)
    assert seconds > 7
    cell, [note] = finding.glance(p50, "p50", "a vs b", undecided=pairs._to_decide(p50, comparison.candidate))
    assert cell == "p50 ?"
    assert note.alone.startswith("p50 ? (inconclusive): a vs b 0.9")
    assert note.alone.endswith(f"], about {seconds:,} s windows to decide (--duration)")


def test_an_inconclusive_ratio_over_rounds_asks_for_rounds_and_a_decided_one_for_nothing() -> None:
    [group] = group_results(parse_results([_open_result("grpc", "grpc_aio", _batches([5.0] * 5))]))
    # 1.03x [0.95, 1.12] over 3 rounds: within ±10% needs the interval within ln(1.1) - ln(1.03).
    over_rounds = Ratio(1.03, 0.95, 1.12, 0.4, False, equivalent=False, rounds=3)
    needed = rounds_needed(math.log(1.12 / 1.03), 3, math.expm1(math.log(1.1) - math.log(1.03)))
    assert needed > 3
    assert pairs._to_decide(over_rounds, group) == f"about {needed:,} rounds to decide (--repeats)"
    # An interval as narrow as deciding needs asks for nothing more.
    assert pairs._to_decide(Ratio(1.2, 1.15, 1.25, 0.001, True, rounds=3), group) == ""
