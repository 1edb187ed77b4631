"""Issue 36's statistics audit: the rounds a ratio needs (t at the count sought, rounds paired), the
method line that says what is done, a suspect latency repeat named in its finding, and the
interval-width rule (wider than 3x: no finding, no interval in a table, the rounds it needs instead),
and a payload line that does not fit claiming no crossover.
Per-repeat percentile support and the one centre per group are in test_latency_samples.py."""

import math

import pytest
from labrunner.report import cells, repeats
from labrunner.report import payload_model as pm
from labrunner.report.findings import finding as finding_model
from labrunner.report.findings import pairs as pair_findings
from labrunner.report.findings import text as findings_text
from labrunner.report.stats import RATIO_METHOD_LINE, Ratio, Summary, too_few_rounds
from labrunner.results.result import parse_results
from labrunner.results.trust import MAX_INTERVAL_WIDTH, SETTLED_HALF_WIDTH, rounds_needed

from tests.unit.test_findings import _find, _one, _result, _run
from tests.unit.test_findings_sentences import CLOSED, LATENCY, _loaded
from tests.unit.test_payload_model import COUNTS, _affine, _models

T_975_DF2 = 4.3027  # two-sided 95%, 2 degrees of freedom (printed tables)
T_975_DF17 = 2.110
T_975_DF18 = 2.101


def _half_width(sd: float, rounds: int, t: float) -> float:
    """The log half-width an interval of `rounds` rounds with this sd of log ratios has."""
    return t * sd / math.sqrt(rounds)


def test_the_rounds_needed_take_t_at_the_count_sought() -> None:
    goal = math.log(1 + SETTLED_HALF_WIDTH)
    # The sd at which 19 rounds just reach ±5% by the printed t(18); t(17) at 18 rounds misses.
    sd = goal * math.sqrt(19) / T_975_DF18
    assert _half_width(sd, 18, T_975_DF17) > goal
    # Measured with 3 rounds (t(2) 4.303): 19, where keeping t(2) would give (4.303 / 2.101)^2 x 19 = 80.
    assert rounds_needed(_half_width(sd, 3, T_975_DF2), 3) == 19
    # The same spread measured with 10 rounds needs as many.
    assert rounds_needed(_half_width(sd, 10, 2.262), 10) == 19
    with pytest.raises(ValueError):
        rounds_needed(0.5, 1)


def test_the_issues_77_repeats_are_19_rounds() -> None:
    # The README's run: req/s ±28% from 3 rounds, "about 77 repeats" under the old sizing.
    wide = Ratio(1.18, 1.18 / 1.2805, 1.18 * 1.2805, 0.2, False, rounds=3)
    assert pair_findings._rounds_needed(wide, None) == "req/s ±28%: about 19 rounds for ±5% (--precision)"


def test_the_method_lines_say_paired_rounds_and_holm_and_welch_only_where_unpaired() -> None:
    assert "pairs its groups' repeats round by round" in RATIO_METHOD_LINE
    assert "geometric mean of the per-round ratios" in RATIO_METHOD_LINE
    assert "(Holm)" in RATIO_METHOD_LINE
    assert "Welch's t-test" in RATIO_METHOD_LINE.split("Where repeats have no partner", 1)[1]
    md = "\n".join(repeats.across_repeats_markdown(parse_results(_run(CLOSED))))
    assert RATIO_METHOD_LINE in md and "(Welch;" not in md


def test_a_suspect_latency_repeat_is_named_in_its_finding() -> None:
    loaded = _loaded(LATENCY, 200)
    second = next(r for r in loaded if r["scenario"]["target"] == "quart-h1" and r["scenario"]["repeat"] == 2)
    second["suspect"] = ["5 iterations dropped"]
    finding = _one(_find(_run(CLOSED) + loaded), "gRPC vs REST", "vs quart-h1")
    suspect = "quart-h1 at 200 req/s: 1 of 3 repeats suspect, see summary.md"
    assert suspect in finding.caveats
    # ... in one note with what else is said about quart-h1 at that load, its rank a suspect's.
    assert (
        "quart-h1 at 200 req/s: 1 of 3 repeats suspect, see summary.md; CPU 98%",
        finding_model.SUSPECT,
    ) in (findings_text.by_question([finding]).notes)
    # A suspect closed repeat is named by its target alone, as before.
    closed = _run(CLOSED)
    closed[0] = _result("grpc", 1, 600, suspect=("k6 used 90% of its CPUs",))
    both = _one(_find(closed + loaded), "gRPC vs REST", "vs quart-h1")
    assert both.caveats[0] == "grpc, closed model: 1 of 3 repeats suspect, see summary.md"
    assert suspect in both.caveats


def test_an_interval_wider_than_three_times_is_no_finding_and_no_table_interval() -> None:
    assert MAX_INTERVAL_WIDTH == 3.0
    at_limit = Ratio(1.0, 1 / math.sqrt(3), math.sqrt(3), 0.5, False, rounds=2)  # exactly 3x: kept
    assert too_few_rounds(at_limit.estimate, at_limit.low, at_limit.high, 2) is None
    # The README's p99: 0.05x [0.00, 4376.40] from 2 rounds.
    tail = Ratio(0.05, 1e-6, 4376.40, 0.9, False, rounds=2)
    reason = too_few_rounds(tail.estimate, tail.low, tail.high, 2)
    assert reason is not None and reason.startswith("too few rounds: about ")
    assert finding_model.glance(tail, "p99", "a vs b") == (
        "p99 —",
        [finding_model.Note(f"a vs b: {reason}", "p99 —", 1)],
    )
    assert pair_findings._figure(tail, "CPU/req") == "CPU/req —"
    assert cells.ratio_cell(tail) == f"— ({reason})"
    assert repeats._ratio(tail) == f"— ({reason})"
    # A group's interval: the report's "174.63 [0.00, 2263326.83]" keeps its centre, not its interval.
    group = Summary(2, 174.63, 1e-3, 2263326.83, 100.0, 300.0)
    interval = cells.interval_cell(group, "p99")
    assert interval.startswith("— (too few rounds: about ") and "2263326" not in interval
    assert repeats._centre(group, "{:.2f}") == f"174.63 {interval}"
    assert cells.centre_interval_cells(group, "{:.2f}")[2] == interval


def test_a_wide_significant_ratio_has_no_effect_to_rank_by() -> None:
    # req/s 1.5x every round but for one: significant, yet far wider than 3x over 3 rounds.
    results = _run({"grpc": [600, 6000, 590], "quart-h1": [400, 405, 395]})
    finding = _one(_find(results), "gRPC vs REST", "vs quart-h1")
    assert "req/s —, CPU/req" in finding.sentence
    assert finding.caveats[-1].startswith("req/s —: grpc vs quart-h1: too few rounds: about ")
    assert finding.effect == 0.0


def test_a_payload_line_that_misses_its_held_out_count_claims_no_crossover() -> None:
    # gRPC exact on 0.5 + 0.002 n; aiohttp-h1 on 0.3 + 0.004 n, bending up 40% at its largest count.
    bent = _affine(0.3, 0.004, {COUNTS[-1]: (1.4, 1.4, 1.4)})
    grpc, rest = _models(_affine(0.5, 0.002), bent)
    assert rest.held_out is not None and rest.held_out.error < -pm.LINEAR_FIT_MISS
    c = pm.crossover(grpc, rest)
    assert c.resolved is None
    text = pm.crossover_text(c)
    assert text.startswith("no crossover claimed, the linear model does not fit aiohttp-h1 (its fit without ")
    assert "beyond ±10%" in text
    # A bend within the margin keeps the crossover.
    slight = pm.crossover(*_models(_affine(0.5, 0.002), _affine(0.3, 0.004, {COUNTS[-1]: (1.05,) * 3})))
    assert slight.misfit == "" and pm.crossover_text(slight).startswith("crosses at ")


def test_a_misfit_crossover_comes_from_the_two_counts_where_the_costs_change_order() -> None:
    # gRPC exact on 0.5 + 0.002 n; REST on 0.2 + 0.004 n, 1.4x at 1,000: cheaper than gRPC up to 100,
    # dearer at 1,000. Its lines through 100 and 1,000 alone: 0.6 ms and 4.2 · 1.4 = 5.88 ms.
    grpc, rest = _models(_affine(0.5, 0.002), _affine(0.2, 0.004, {1000: (1.4, 1.4, 1.4)}))
    assert pm.misfit(rest) and not pm.misfit(grpc)
    c = pm.crossover(grpc, rest)
    slope = (5.88 - 0.6) / 900
    expected = (0.5 - (0.6 - slope * 100)) / (slope - 0.002)  # 125.9, not the whole lines' 150
    assert c.segment == (100, 1000)
    assert c.resolved == pytest.approx(expected, rel=1e-6)
    assert c.interval is not None and c.interval == pytest.approx((expected, expected), rel=1e-9)
    assert c.grpc_cheaper_above  # REST's segment rises faster: gRPC is the cheaper above 126
    assert pm.crossover_text(c) == (
        "crosses at 126 records [126, 126], gRPC cheaper above (from the lines through 100 and 1,000 "
        "records alone: one line over every count misses its held-out count)"
    )


def test_a_misfit_without_a_change_of_order_says_which_side_costs_more_throughout() -> None:
    # gRPC dearer at every count: 1.0 + 0.01 n against REST's bent 0.3 + 0.004 n.
    grpc, rest = _models(_affine(1.0, 0.01), _affine(0.3, 0.004, {1000: (1.4, 1.4, 1.4)}))
    c = pm.crossover(grpc, rest)
    assert c.segment is None and c.throughout == "more" and c.resolved is None
    assert pm.crossover_text(c) == (
        "no crossover from 1 to 1,000 records, gRPC costs more at every count "
        "(one line over every count misses its held-out count)"
    )
    cheaper = pm.crossover(*_models(_affine(0.2, 0.001), _affine(0.3, 0.004, {1000: (1.4, 1.4, 1.4)})))
    assert cheaper.throughout == "less"
