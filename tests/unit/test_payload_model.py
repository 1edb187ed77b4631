"""Unit tests: the payload cost model (CPU per request = a + b·n per target, where gRPC and REST
cross, the held-out check, the encoding alone) on synthetic results."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from labrunner.model.matrix import Overrides, Scenario, expand, load_matrix
from labrunner.report import payload_model as pm
from labrunner.report import payload_sweep
from labrunner.report.compare import Group, group_results
from labrunner.report.sections import payload_sweep as payload_section
from labrunner.report.serialization import Case
from labrunner.results.result import parse_results
from scipy import optimize
from scipy import stats as scipy_stats

from tests.support import ROOT, ok_result
from tests.unit.test_payload_sweep import COUNTS, DURATION_S, JITTER, QUOTA_USED

SAME = (1.0, 1.0, 1.0)  # three repeats without spread

Costs = Mapping[str, Mapping[int, Sequence[float]]]  # target -> count -> ms per request of each repeat


@cache
def _scenarios(repeats: int) -> tuple[Scenario, ...]:
    overrides = Overrides(
        targets=("aiohttp-h1", "grpc"),
        repeats=repeats,
        directions=("download",),
        profiles=("quarter",),
        counts=COUNTS,
    )
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides).scenarios


def _result(scenario: Scenario, cost_ms: float, quota_used: float) -> dict[str, Any]:
    """A CPU-bound repeat whose CPU per request is exactly cost_ms."""
    requests = round(scenario.profile.cpus * quota_used * DURATION_S * 1000 / cost_ms)
    return ok_result(
        scenario,
        requests=requests,
        rps=requests / DURATION_S,
        latency_ms={"avg": 10.0, "p50": 9.0, "p90": 12.0, "p95": 14.0, "p99": 20.0},
        received_bytes=requests * 1000,
        window_s=DURATION_S,
        cpu_seconds=cost_ms * requests / 1000,
        quota_used=quota_used,
    )


def _groups(costs: Costs, idle: Mapping[tuple[str, int], float] | None = None) -> dict[str, list[Group]]:
    """target -> its groups by count; idle: (target, count) -> the service's share of its quota."""
    repeats = len(next(iter(next(iter(costs.values())).values())))
    shares = idle or {}
    results = [
        _result(
            s, costs[s.target.name][s.count][s.repeat - 1], shares.get((s.target.name, s.count), QUOTA_USED)
        )
        for s in _scenarios(repeats)
        if s.count in costs.get(s.target.name, {}) and not s.target.tls
    ]
    by_target: dict[str, list[Group]] = {}
    for g in group_results(parse_results(results)):
        by_target.setdefault(g.target, []).append(g)
    return {target: sorted(groups, key=lambda g: g.count) for target, groups in by_target.items()}


def _affine(
    fixed: float, per_record: float, factors: Mapping[int, Sequence[float]] | None = None
) -> dict[int, list[float]]:
    """Three repeats at each count of fixed + per_record · n, times factors[n] (none: exact)."""
    return {n: [(fixed + per_record * n) * f for f in (factors or {}).get(n, SAME)] for n in COUNTS}


def _models(
    grpc: Mapping[int, Sequence[float]], rest: Mapping[int, Sequence[float]]
) -> tuple[pm.CostModel, pm.CostModel]:
    groups = _groups({"grpc": grpc, "aiohttp-h1": rest})
    grpc_model, rest_model = pm.fit_target(groups["grpc"]), pm.fit_target(groups["aiohttp-h1"])
    assert grpc_model is not None and rest_model is not None
    return grpc_model, rest_model


def _crossover(grpc: Mapping[int, Sequence[float]], rest: Mapping[int, Sequence[float]]) -> pm.Crossover:
    return pm.crossover(*_models(grpc, rest))


def test_exact_affine_costs_give_back_a_and_b() -> None:
    model = pm.fit_target(_groups({"grpc": _affine(0.3, 0.005)})["grpc"])
    assert model is not None
    assert model.counts == COUNTS and len(model.points) == 12
    line = model.line
    assert line.fixed.value == pytest.approx(0.3, rel=1e-9)
    assert line.per_record.value == pytest.approx(0.005, rel=1e-9)
    assert line.df == 10
    # No residuals: the intervals shrink to the values.
    assert (line.fixed.low, line.fixed.high) == pytest.approx((0.3, 0.3), rel=1e-6)
    assert (line.per_record.low, line.per_record.high) == pytest.approx((0.005, 0.005), rel=1e-6)
    assert model.held_out is not None and model.held_out.error == pytest.approx(0.0, abs=1e-9)
    assert model.idle == () and model.missing == ()


class HandFit:
    """Weighted least squares in closed form, weights 1/m² (m: the mean of the count's repeats)."""

    def __init__(self, records: Sequence[int], costs: Sequence[float]) -> None:
        x, y = np.array(records, dtype=float), np.array(costs)
        means = {n: y[x == n].mean() for n in set(records)}
        w = np.array([1 / means[n] ** 2 for n in records])
        self.total, self.x_bar = w.sum(), (w * x).sum() / w.sum()
        self.sxx = (w * (x - self.x_bar) ** 2).sum()
        self.b = (w * (x - self.x_bar) * (y - (w * y).sum() / w.sum())).sum() / self.sxx
        self.a = (w * y).sum() / w.sum() - self.b * self.x_bar
        self.df = len(y) - 2
        self.s2 = (w * (y - self.a - self.b * x) ** 2).sum() / self.df

    def prediction_variance(self, records: float) -> float:
        """The variance of the fitted mean a + b·records."""
        return float(self.s2 * (1 / self.total + (records - self.x_bar) ** 2 / self.sxx))


def test_a_noisy_fit_is_weighted_least_squares_by_hand() -> None:
    records = [1, 1, 10, 10, 100, 100]
    costs = [0.30, 0.32, 0.36, 0.34, 0.83, 0.79]
    line = pm.fit_line(records, costs)
    hand = HandFit(records, costs)
    t = scipy_stats.t.ppf(0.975, 4)
    se_a, se_b = math.sqrt(hand.prediction_variance(0)), math.sqrt(hand.s2 / hand.sxx)
    assert line.fixed.value == pytest.approx(hand.a, rel=1e-9)
    assert line.per_record.value == pytest.approx(hand.b, rel=1e-9)
    assert (line.fixed.low, line.fixed.high) == pytest.approx(
        (hand.a - t * se_a, hand.a + t * se_a), rel=1e-9
    )
    assert (line.per_record.low, line.per_record.high) == pytest.approx(
        (hand.b - t * se_b, hand.b + t * se_b), rel=1e-9
    )
    assert line.covariance is not None
    assert line.covariance.both == pytest.approx(-hand.x_bar * hand.s2 / hand.sxx, rel=1e-9)
    # Unweighted least squares gives another a: the test tells the two apart.
    assert np.polyfit(records, costs, 1)[1] != pytest.approx(hand.a, rel=1e-6)


def test_two_points_give_a_line_without_intervals() -> None:
    line = pm.fit_line([10, 100], [0.4, 1.3])
    assert (line.fixed.value, line.per_record.value) == pytest.approx((0.3, 0.01))
    assert line.fixed.low is None and line.covariance is None and line.df == 0
    with pytest.raises(ValueError, match="two or more counts"):
        pm.fit_line([10, 10], [0.4, 0.5])


@pytest.mark.parametrize(
    ("rest_fixed", "rest_per_record", "expected"), [(0.3, 0.007, 40.0), (0.272, 0.006, 57.0)]
)
def test_the_crossover_of_exact_lines_is_where_they_meet(
    rest_fixed: float, rest_per_record: float, expected: float
) -> None:
    # The per-count interpolation in (log bytes, log ratio) put these at 29.2 and 48.5 records.
    c = _crossover(_affine(0.5, 0.002), _affine(rest_fixed, rest_per_record))
    assert c.records == pytest.approx(expected, rel=1e-9)
    assert c.interval == pytest.approx((expected, expected), rel=1e-6)
    assert c.grpc_cheaper_above and not c.unbounded and c.reason == "" and c.resolved == c.records
    assert c.span == (1, 1000)
    assert (
        pm.crossover_text(c)
        == f"crosses at {expected:.0f} records [{expected:.0f}, {expected:.0f}], gRPC cheaper above"
    )


def _jittered() -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """gRPC at 0.5 ms + 2 µs per record, REST at 0.3 ms + 7 µs, with spread: they meet at 40."""
    return _affine(0.5, 0.002, JITTER["grpc"]), _affine(0.3, 0.007, JITTER["aiohttp-h1"])


def test_a_noisy_crossover_inside_the_sweep_has_an_interval_around_it() -> None:
    c = _crossover(*_jittered())
    assert c.records is not None and c.interval is not None
    low, high = c.interval
    assert 10 < low < c.records < high < 100
    assert c.records == pytest.approx(40, rel=0.15)
    text = pm.crossover_text(c)
    assert text.startswith(f"crosses at {c.records:.0f} records [{low:.0f}, {high:.0f}], gRPC cheaper above")
    assert "extrapolated" not in text
    # Fieller's ends are where the lines' difference stops being significant: at each, by hand,
    # |gRPC - REST| = t · its standard error, the two fits independent.
    grpc, rest = (HandFit(*zip(*m.points, strict=True)) for m in _models(*_jittered()))
    t = scipy_stats.t.ppf(0.975, min(grpc.df, rest.df))
    for end in c.interval:
        difference = (grpc.a + grpc.b * end) - (rest.a + rest.b * end)
        spread = math.sqrt(grpc.prediction_variance(end) + rest.prediction_variance(end))
        assert abs(difference) == pytest.approx(t * spread, rel=1e-6)


def test_a_crossover_beyond_the_sweep_is_extrapolated_and_said_so() -> None:
    above = _crossover(_affine(0.5, 0.004), _affine(0.3, 0.0041))
    assert above.records == pytest.approx(2000, rel=1e-6)
    assert pm.crossover_text(above).endswith("gRPC cheaper above (extrapolated beyond 1,000)")
    below = _crossover(_affine(0.305, 0.002), _affine(0.3, 0.012))
    assert below.records == pytest.approx(0.5, rel=1e-6)
    assert (
        pm.crossover_text(below)
        == "crosses at 0.5 records [0.5, 0.5], gRPC cheaper above (extrapolated below 1)"
    )


def test_no_crossover_when_grpc_costs_more_or_less_both_per_record_and_per_request() -> None:
    more = _crossover(_affine(0.5, 0.006), _affine(0.3, 0.005))
    assert more.records == pytest.approx(-200, rel=1e-6) and more.resolved is None
    assert more.reason == "gRPC costs more per record and per request"
    assert pm.crossover_text(more).startswith(
        "no crossover, gRPC costs more per record and per request (lines meet at -200"
    )
    less = _crossover(_affine(0.2, 0.004), _affine(0.3, 0.005))
    assert less.reason == "gRPC costs less per record and per request"


def _given(fixed: float, per_record: float) -> pm.CostModel:
    """A cost model given by its line alone, without residuals, over 1 to 1,000 records."""
    line = pm.Line(pm.Estimate(fixed, None, None), pm.Estimate(per_record, None, None), None, 0)
    ends = tuple((n, fixed + per_record * n) for n in (1, 1000))
    return pm.CostModel("target", "http1.1", ends, line, None, (), ())


def _uncertain(fixed: float, per_record: float) -> pm.CostModel:
    """A cost model given by its line over 100 to 1,000 records, each coefficient spread (a by 0.01 ms)
    on 4 degrees of freedom."""
    spread = pm.Covariance(fixed=1e-4, per_record=1e-12, both=0.0)
    line = pm.Line(pm.Estimate(fixed, None, None), pm.Estimate(per_record, None, None), spread, 4)
    ends = tuple((n, fixed + per_record * n) for n in (100, 1000))
    return pm.CostModel("target", "http1.1", ends, line, None, (), ())


def test_a_crossover_interval_reaching_below_0_records_ends_at_0() -> None:
    # The lines meet at 200 records; a spread of 0.01 ms in each fixed cost puts Fieller's low end near
    # -190 records, which no call carries: the interval starts at 0 and keeps Fieller's high end.
    c = pm.crossover(_uncertain(0.30, 0.0020), _uncertain(0.28, 0.0021))
    fieller = pm.fieller(
        0.02, 0.0001, var_numerator=2e-4, var_denominator=2e-12, covariance=0.0, t=scipy_stats.t.ppf(0.975, 4)
    )
    assert c.records == pytest.approx(200) and fieller is not None and fieller[0] < -100
    assert c.interval == (0.0, pytest.approx(fieller[1])) and c.resolved == c.records
    text = pm.crossover_text(c)
    assert text == f"crosses at 200 records [0.0, {fieller[1]:,.0f}], gRPC cheaper above"


def test_parallel_lines_have_no_crossover() -> None:
    exact = pm.crossover(_given(0.5, 0.005), _given(0.3, 0.005))
    assert exact.records is None and exact.resolved is None
    assert pm.crossover_text(exact) == "no crossover, the lines are parallel (equal cost per record)"
    # Equal per record within the repeats' spread: Fieller's set is unbounded.
    noisy = _crossover(_affine(0.5, 0.005, JITTER["grpc"]), _affine(0.3, 0.005, JITTER["aiohttp-h1"]))
    assert noisy.unbounded and noisy.interval is None and noisy.resolved is None
    assert pm.crossover_text(noisy).startswith(
        "no crossover resolved, per-record costs not told apart (interval unbounded; lines meet at "
    )


def test_fieller_by_hand() -> None:
    # (2 - 1θ)² <= 4 (0.04 + 0.01θ²): 0.96θ² - 4θ + 3.84 <= 0, roots (2 ± 0.56) / 0.96.
    low, high = pm.fieller(2, 1, var_numerator=0.04, var_denominator=0.01, covariance=0, t=2) or (0, 0)
    assert (low, high) == pytest.approx((1.5, 2.56 / 0.96))
    # A denominator within t standard errors of 0: unbounded.
    assert pm.fieller(2, 0.1, var_numerator=0.04, var_denominator=0.01, covariance=0, t=2) is None


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-10, 10),
    st.floats(-10, 10).filter(lambda d: abs(d) > 1e-3),
    st.floats(0, 4),
    st.floats(0, 4),
    st.floats(-1, 1),
    st.floats(0.5, 5),
)
def test_a_bounded_fieller_interval_holds_the_estimate_and_solves_its_equation(
    numerator: float, denominator: float, sd_n: float, sd_d: float, correlation: float, t: float
) -> None:
    v_nn, v_dd, v_nd = sd_n**2, sd_d**2, correlation * sd_n * sd_d
    interval = pm.fieller(
        numerator, denominator, var_numerator=v_nn, var_denominator=v_dd, covariance=v_nd, t=t
    )
    if interval is None:  # the denominator does not differ from 0, or by a rounding's hair
        assert denominator**2 - t**2 * v_dd <= pm.ROUNDING * denominator**2
        return
    low, high = interval
    estimate = numerator / denominator
    scale = max(1.0, abs(estimate))
    assert low - 1e-9 * scale <= estimate <= high + 1e-9 * scale
    for theta in interval:  # each end is a root of (N - θD)² = t² (v_NN - 2θ v_ND + θ² v_DD)
        lhs = (numerator - theta * denominator) ** 2
        rhs = t**2 * (v_nn - 2 * theta * v_nd + theta**2 * v_dd)
        assert lhs == pytest.approx(rhs, rel=1e-6, abs=1e-6 * (1 + theta**2))


def test_the_held_out_count_is_predicted_by_the_fit_without_it() -> None:
    curved = _affine(0.3, 0.005)
    curved[1000] = [(0.3 + 0.005 * 1000) * 1.25] * 3  # the largest count costs 25% more than the line
    model = pm.fit_target(_groups({"grpc": curved})["grpc"])
    assert model is not None and model.held_out is not None
    held = model.held_out
    assert held.count == 1000
    assert held.predicted == pytest.approx(5.3, rel=1e-9)  # the line through 1, 10 and 100
    assert held.measured == pytest.approx(5.3 * 1.25, rel=1e-9)
    assert held.error == pytest.approx(1 / 1.25 - 1, rel=1e-9)
    assert pm.held_out_sentence([model]) == (
        "cost model check: each target's fit without its largest count predicts it within 20.0% "
        "(1 targets; largest error grpc -20.0% at 1,000 records)"
    )


def test_two_counts_are_fitted_but_not_checked() -> None:
    two = {n: costs for n, costs in _affine(0.3, 0.005).items() if n in (10, 100)}
    model = pm.fit_target(_groups({"grpc": two})["grpc"])
    assert model is not None and model.held_out is None
    assert (
        pm.held_out_sentence([model]) == "cost model not checked: a held-out count needs three or more counts"
    )
    one = {100: _affine(0.3, 0.005)[100]}
    assert pm.fit_target(_groups({"grpc": one})["grpc"]) is None


def test_a_service_below_half_its_quota_stays_in_the_fit_and_is_named() -> None:
    groups = _groups({"grpc": _affine(0.3, 0.005)}, idle={("grpc", 1): 0.3})["grpc"]
    assert groups[0].count == 1 and groups[0].lower_bound is not None  # a lower bound for throughput
    model = pm.fit_target(groups)
    assert model is not None
    assert model.counts == COUNTS and model.idle == (pm.Idle(1, pytest.approx(0.3)),)
    assert model.line.fixed.value == pytest.approx(0.3, rel=1e-9)


def _cases(codec: str, fixed_us: float, per_record_us: float) -> list[Case]:
    return [
        Case(codec, "encode", n, 100 * n, 100, 15, fixed_us + per_record_us * n, None, None, 0.0, 0.0)
        for n in COUNTS
    ]


def test_the_encoding_alone_per_record_and_its_share_of_the_servers_difference() -> None:
    decode = Case("orjson", "decode", 10, 1000, 100, 15, 99.0, None, None, 0.0, 0.0)
    encodings = pm.encoding_lines([*_cases("protobuf", 1.0, 0.3), *_cases("orjson", 0.5, 0.9), decode])
    assert encodings["protobuf"].per_record.value == pytest.approx(0.0003, rel=1e-9)  # ms per record
    assert encodings["orjson"].per_record.value == pytest.approx(0.0009, rel=1e-9)
    grpc, rest = _models(_affine(0.5, 0.002, JITTER["grpc"]), _affine(0.3, 0.007, JITTER["aiohttp-h1"]))
    split = pm.per_record_split(grpc.line, rest.line, encodings)
    assert split is not None
    assert split.servers.value == pytest.approx(grpc.line.per_record.value - rest.line.per_record.value)
    assert split.servers.value == pytest.approx(-0.005, rel=0.1)
    assert split.encoding == pytest.approx(-0.0006, rel=1e-9)
    assert split.format_share == pytest.approx(-0.0006 / split.servers.value)
    assert pm.per_record_split(grpc.line, rest.line, {"orjson": encodings["orjson"]}) is None
    # Per-record costs not told apart: no share of them to give.
    grpc, rest = _models(_affine(0.5, 0.005, JITTER["grpc"]), _affine(0.3, 0.005, JITTER["aiohttp-h1"]))
    split = pm.per_record_split(grpc.line, rest.line, encodings)
    assert split is not None and split.format_share is None


# A host that moves from round to round: both sides of a round slowed or sped up alike (a duet block).
HOST = (0.8, 1.0, 1.25)
# What is left of a round's ratio once the host cancels: ±1%.
RATIO_NOISE = {"grpc": (1.01, 0.99, 1.0), "aiohttp-h1": (0.99, 1.0, 1.01)}


def _drifting(fixed: float, per_record: float, target: str) -> dict[int, list[float]]:
    """_affine's three rounds, each times the host's factor of that round and the target's noise."""
    factors = {n: [h * e for h, e in zip(HOST, RATIO_NOISE[target], strict=True)] for n in COUNTS}
    return _affine(fixed, per_record, factors)


def _round_ratios(
    grpc: Mapping[int, Sequence[float]], rest: Mapping[int, Sequence[float]]
) -> list[tuple[int, float]]:
    return [(n, g / r) for n in COUNTS for g, r in zip(grpc[n], rest[n], strict=True)]


def test_exact_ratios_cross_where_the_lines_meet() -> None:
    grpc, rest = _affine(0.5, 0.002), _affine(0.3, 0.007)
    c = pm.paired_crossover(_round_ratios(grpc, rest), (1, 1000))
    assert c is not None and c.paired is not None
    assert c.records == pytest.approx(40, rel=1e-6)
    assert c.interval == pytest.approx((40, 40), rel=1e-3)
    assert c.grpc_cheaper_above and c.resolved == c.records
    # The ratio model is the two lines over REST's a.
    assert (c.paired.fixed, c.paired.per_record, c.paired.rest_per_record) == pytest.approx(
        (0.5 / 0.3, 0.002 / 0.3, 0.007 / 0.3), rel=1e-6
    )
    assert c.paired.df == 9


def test_the_paired_ratios_cancel_a_host_that_moves_both_sides_of_a_round() -> None:
    grpc, rest = _drifting(0.5, 0.002, "grpc"), _drifting(0.3, 0.007, "aiohttp-h1")
    paired = pm.crossover(*_models(grpc, rest), _round_ratios(grpc, rest))
    apart = pm.crossover(*_models(grpc, rest))  # the lines fitted apart carry the host's ±25%
    assert paired.paired is not None and paired.interval is not None
    low, high = paired.interval
    assert low < 40 < high and high / low < 1.3
    assert apart.paired is None
    assert apart.unbounded or (apart.interval is not None and apart.interval[1] / apart.interval[0] > 2)
    assert pm.crossover_text(paired).startswith(
        f"crosses at {paired.records:.0f} records [{low:.0f}, {high:.0f}]"
    )


def test_a_profile_interval_end_is_where_the_ratios_start_to_reject_a_crossing() -> None:
    grpc, rest = _drifting(0.5, 0.002, "grpc"), _drifting(0.3, 0.007, "aiohttp-h1")
    ratios = _round_ratios(grpc, rest)
    c = pm.paired_crossover(ratios, (1, 1000))
    assert c is not None and c.interval is not None and c.paired is not None
    # By hand: the least squares of a model through each end, against the best model's.
    records = np.array([n for n, _ in ratios], dtype=float)
    logs = np.log([r for _, r in ratios])
    best = c.paired.residual**2 * c.paired.df
    limit = best + c.paired.residual**2 * scipy_stats.t.ppf(0.975, c.paired.df) ** 2

    def least(end: float) -> float:
        """The least squares of a ratio model crossing at end, by another optimizer (Nelder-Mead) from a
        spread of starts than the module's."""

        def through(log_slopes: np.ndarray) -> float:
            beta, gamma = np.exp(log_slopes)
            alpha = 1 + (gamma - beta) * end
            if alpha <= 0:
                return math.inf
            return float(np.sum((np.log(alpha + beta * records) - np.log1p(gamma * records) - logs) ** 2))

        starts = [np.log([b, g]) for b in (1e-3, 1e-2) for g in (1e-3, 1e-2, 1e-1)]
        options = {"xatol": 1e-10, "fatol": 1e-14}
        return min(optimize.minimize(through, s0, method="Nelder-Mead", options=options).fun for s0 in starts)

    low, high = c.interval
    assert least(low * 1.01) < limit < least(low * 0.99)
    assert least(high * 0.99) < limit < least(high * 1.01)


def test_ratio_model_equal_per_record_costs_leave_the_crossing_unbounded() -> None:
    grpc, rest = _drifting(0.5, 0.007, "grpc"), _drifting(0.3, 0.007, "aiohttp-h1")
    c = pm.paired_crossover(_round_ratios(grpc, rest), (1, 1000))
    assert c is not None and c.resolved is None
    assert c.unbounded or (c.records is not None and c.records <= 0)


def test_too_few_counts_or_rounds_leave_the_crossover_to_the_lines() -> None:
    grpc, rest = _affine(0.5, 0.002), _affine(0.3, 0.007)
    ratios = _round_ratios(grpc, rest)
    assert pm.paired_crossover([r for r in ratios if r[0] in (1, 10)], (1, 10)) is None  # two counts
    one_round = [r for i, r in enumerate(ratios) if i % 3 == 0]  # 4 ratios, 1 degree of freedom
    assert pm.paired_crossover(one_round, (1, 1000)) is None
    assert pm.crossover(*_models(grpc, rest), one_round).paired is None


def test_a_ratio_the_model_cannot_follow_is_named_and_the_crossover_sought_between_counts() -> None:
    # REST's cost at 100 records is 1.5x its line's, the rounds agree within ±1%: no ratio of two lines
    # through all four counts follows that, and the lack of fit against the rounds' spread shows it.
    grpc = _drifting(0.5, 0.002, "grpc")
    rest = _drifting(0.3, 0.007, "aiohttp-h1")
    rest[100] = [v * 1.5 for v in rest[100]]
    ratios = _round_ratios(grpc, rest)
    fitted = pm.paired_crossover(ratios, (1, 1000))
    assert fitted is not None and fitted.paired is not None and fitted.paired.lack_of_fit is not None
    # By hand: the F test of the lack of fit against the rounds' spread about their count's mean.
    logs = {n: np.log([r for m, r in ratios if m == n]) for n in COUNTS}
    pure = sum(float(np.sum((v - v.mean()) ** 2)) for v in logs.values())
    rss = fitted.paired.residual**2 * fitted.paired.df
    f = (rss - pure) / 1 / (pure / 8)
    assert fitted.paired.lack_of_fit == pytest.approx(scipy_stats.f.sf(f, 1, 8), rel=1e-6)
    assert fitted.paired.lack_of_fit < pm.LACK_OF_FIT
    # Lines given without a held-out check, so the ratios' lack of fit alone decides.
    c = pm.crossover(_given(0.5, 0.002), _given(0.3, 0.007), ratios)
    assert c.paired is None and c.misfit.startswith("the ratio of two lines does not fit the blocks' ratios")
    assert c.segment == (1, 1000)  # the given lines' only counts, where gRPC and REST change order
    assert pm.crossover_text(c).endswith(
        "(from the lines through 1 and 1,000 records alone: "
        "the ratio of two lines does not fit the blocks' ratios)"
    )


def test_a_line_that_bends_at_the_largest_count_leaves_the_crossover_to_the_ratios_below_it() -> None:
    # gRPC 0.3 + 0.0017 n ms against REST 0.35 + 0.0009 n, whose cost bends at 1,000 records (1.8x its
    # line, as Quart's read on a 2-vCPU VM): its line fitted apart misses its held-out count, and two
    # lines fitted apart carry the host's ±25% from round to round (unbounded between 10 and 100). The
    # blocks' ratios at 1-100 records cancel the host and hold no bend: the crossover from them is the
    # one the costs without a bend give there, and it covers the lines' 62.5.
    grpc = _drifting(0.3, 0.0017, "grpc")
    rest = _drifting(0.35, 0.0009, "aiohttp-h1")
    straight = _round_ratios(grpc, rest)
    rest[1000] = [v * 1.8 for v in rest[1000]]
    models = _models(grpc, rest)
    apart = pm.crossover(*models)
    assert apart.segment == (10, 100) and apart.unbounded and apart.resolved is None
    c = pm.crossover(*models, _round_ratios(grpc, rest))
    below = pm.paired_crossover([r for r in straight if r[0] <= 100], (1, 100))
    assert below is not None and c.paired is not None and c.misfit == "" and c.segment is None
    assert (c.records, c.interval) == (below.records, below.interval)
    assert c.interval is not None and 10 < c.interval[0] < 62.5 < c.interval[1] < 100
    assert c.bends == "aiohttp-h1's own line misses 1,000 records by -44.4%"
    assert pm.crossover_text(c) == (
        f"crosses at {pm.records(below.records)} records [{pm.records(c.interval[0])}, "
        f"{pm.records(c.interval[1])}], gRPC cheaper below (from the blocks' ratios at 1 to 100 records: "
        "aiohttp-h1's own line misses 1,000 records by -44.4%)"
    )
    # Near the bend the ratios below it place no crossover: REST 0.2 + 0.0021 n, 20% above its line at
    # 1,000 records, crosses gRPC between 100 and 1,000, which the counts below 1,000 do not reach.
    grpc = _drifting(0.5, 0.002, "grpc")
    rest = _drifting(0.2, 0.0021, "aiohttp-h1")
    rest[1000] = [v * 1.2 for v in rest[1000]]
    near = pm.crossover(*_models(grpc, rest), _round_ratios(grpc, rest))
    assert near.paired is None and near.segment == (100, 1000) and near.bends == ""


def test_paired_ratios_on_either_side_of_1_hold_a_segments_crossover_between_its_counts() -> None:
    # REST's cost bends at 1,000 records and again at 10 (30% above its line at each): no ratio of two
    # lines follows that, so the crossover comes from the lines through 100 and 1,000 alone, fitted
    # apart: the host's ±25% from round to round widens their interval below 100 records, where the
    # paired ratios say gRPC still costs more.
    grpc = _drifting(0.5, 0.002, "grpc")
    rest = _drifting(0.2, 0.0028, "aiohttp-h1")
    for bent in (10, 1000):
        rest[bent] = [v * 1.3 for v in rest[bent]]
    models = _models(grpc, rest)
    apart = pm.crossover(*models)
    assert apart.segment == (100, 1000) and apart.unbounded and apart.resolved is None
    ratios = _round_ratios(grpc, rest)
    fitted = pm.paired_crossover(ratios, (1, 1000))
    assert fitted is not None and fitted.paired is not None and pm.ratio_misfit(fitted.paired)
    c = pm.crossover(*models, ratios)
    assert c.misfit.startswith("the linear model does not fit aiohttp-h1")
    assert c.segment == (100, 1000) and c.records == apart.records
    assert c.interval == (100, 1000) and not c.unbounded and c.resolved == pytest.approx(221, abs=1)
    # One round at 100 records tells no side of 1 there: the crossover is held between 10 records, the
    # last where the ratios put gRPC above REST, and 1,000.
    sparse = [r for r in ratios if r[0] != 100] + [next(r for r in ratios if r[0] == 100)]
    held = pm.crossover(*models, sparse)
    assert held.interval == (10, 1000) and not held.unbounded
    # With no ratios, the lines' own interval stands: unbounded.
    assert pm.crossover(*models, [r for r in ratios if r[0] == 1000]).unbounded


def test_ratios_clear_of_1_at_counts_beyond_a_segment_bound_its_crossover_there() -> None:
    # The lines through 100 and 1,000 meet at 200 records with an interval reaching 0; the blocks'
    # ratios put gRPC clearly above REST at 10 records and below it at 1,000: 10 to 593 records.
    lines = pm._lines_crossover(_uncertain(0.30, 0.0020).line, _uncertain(0.28, 0.0021).line, (1, 1000))
    assert lines.interval is not None and lines.interval[0] == 0
    ratios = [(n, r * f) for n, r in ((1, 1.2), (10, 1.1), (1000, 0.8)) for f in (0.99, 1.0, 1.01)]
    ratios += [(100, 0.9), (100, 1.1)]
    held = pm._held_by_ratios(lines, ratios, (1, 10, 100, 1000))
    assert held.interval == (10, lines.interval[1])
    # A ratio clear of 1 on the wrong side of the estimate bounds nothing: at 100 records below 1 (where
    # gRPC is cheaper only above 200) is no end at 100.
    odd = [*ratios[:-2], (100, 0.8), (100, 0.82)]
    assert pm._held_by_ratios(lines, odd, (1, 10, 100, 1000)).interval == (10, lines.interval[1])
    # Both sides told and no interval of its own: the two counts.
    assert pm._held_by_ratios(replace(lines, interval=None, unbounded=True), ratios, (10, 1000)).interval == (
        10,
        1000,
    )


# The host's speed in each round at each count: a repeat's cost and the speed reference beside it both
# take this factor (the same slowdown), as measured on a 2-vCPU VM (run.speed_reference).
DRIFT = {1: (0.8, 1.0, 1.3), 10: (1.2, 0.9, 1.0), 100: (1.0, 1.35, 0.75), 1000: (0.85, 1.0, 1.25)}
UNIT_S = 400e-6  # the reference's CPU per unit at factor 1


def _with_reference(
    costs: Mapping[int, Sequence[float]],
    units: Mapping[int, Sequence[float | None]],
    targets: Mapping[str, float] | None = None,
) -> list[Group]:
    """grpc's groups from costs (each target's, times its factor in targets), each repeat with the
    speed reference's CPU per unit beside it."""
    results = []
    for s in _scenarios(3):
        if s.target.name not in (targets or {"grpc": 1.0}) or s.target.tls:
            continue
        factor = (targets or {"grpc": 1.0})[s.target.name]
        result = _result(s, costs[s.count][s.repeat - 1] * factor, QUOTA_USED)
        unit = units[s.count][s.repeat - 1]
        if unit is not None:
            result["host"] = {"measured": True, "speed_reference": {"seconds_per_unit": unit}}
        results.append(result)
    return sorted(group_results(parse_results(results)), key=lambda g: g.count)


def test_the_speed_reference_takes_the_hosts_drift_out_of_a_and_b() -> None:
    drifted = _affine(0.3, 0.005, DRIFT)
    groups = _with_reference(drifted, {n: [UNIT_S * f for f in DRIFT[n]] for n in COUNTS})
    speed = pm.reference_speed(groups)
    assert speed == pytest.approx(UNIT_S)  # the median repeat's
    raw, steady = pm.fit_target(groups), pm.fit_target(groups, speed)
    assert raw is not None and steady is not None
    # Read at the reference's median speed, each repeat costs exactly a + b·n again.
    assert (steady.line.fixed.value, steady.line.per_record.value) == pytest.approx((0.3, 0.005))
    assert steady.line.per_record.high - steady.line.per_record.low < 1e-9
    assert raw.line.per_record.high - raw.line.per_record.low > 0.001  # the drift, as measured
    # A repeat without the reference beside it (an older window of a resumed run): costs as measured.
    one_missing = {n: [UNIT_S * f for f in DRIFT[n]] for n in COUNTS} | {10: [UNIT_S, None, UNIT_S]}
    assert pm.reference_speed(_with_reference(drifted, one_missing)) is None
    assert pm.reference_speed(_with_reference(drifted, {n: [None] * 3 for n in COUNTS})) is None


def test_a_sweep_reads_both_targets_at_the_runs_one_speed_and_says_so() -> None:
    units = {n: [UNIT_S * f for f in DRIFT[n]] for n in COUNTS}
    groups = _with_reference(_affine(0.3, 0.005, DRIFT), units, {"grpc": 1.0, "aiohttp-h1": 0.5})
    [sweep] = payload_sweep.sweeps(groups, None)
    assert sweep.speed == pytest.approx(UNIT_S)
    assert sweep.grpc_model is not None and sweep.rest_model is not None
    assert sweep.rest_model.line.per_record.value == pytest.approx(0.0025)
    assert sweep.rest_model.line.per_record.high - sweep.rest_model.line.per_record.low < 1e-9
    text = " ".join(str(block) for block in payload_section.section(groups, []))
    assert "at one host speed" in text and "Costs are read at one host speed" in text


@pytest.mark.parametrize(
    ("grpc_fixed", "grpc_per_record", "sharpest"),
    [(0.3, 0.02, 1), (0.3, 0.0024, 100), (0.35, 0.00175, 300), (0.35, 0.0017, 1000)],
)
def test_the_next_block_goes_to_the_count_where_it_narrows_the_crossover_most(
    grpc_fixed: float, grpc_per_record: float, sharpest: int
) -> None:
    # gRPC's line against REST 0.4 + 0.0016 n over five counts, four rounds each 1-3% apart: they
    # cross at 5, 125, 334 and 502 records. By hand: one more block, on the fitted model, at each count
    # in turn; the count whose block narrows the profile interval most is the one the model names. It
    # is not always the nearest: at 502 records a block at 1,000 pins the slope the crossing hangs on.
    counts, noise = (1, 10, 100, 300, 1000), (1.03, 0.98, 0.99, 1.0)
    ratios = [(n, (grpc_fixed + grpc_per_record * n) / (0.4 + 0.0016 * n) * e) for n in counts for e in noise]
    c = pm.paired_crossover(ratios, (1, 1000))
    assert c is not None and c.paired is not None and c.interval is not None

    def width_with_a_block_at(count: int) -> float:
        assert c is not None and c.paired is not None
        more = pm.paired_crossover([*ratios, (count, c.paired.at(count))], (1, 1000))
        assert more is not None and more.interval is not None
        return more.interval[1] / more.interval[0]

    widths = {n: width_with_a_block_at(n) for n in counts}
    assert min(widths, key=widths.__getitem__) == c.paired.sharpest == sharpest


def test_without_a_crossover_at_a_positive_count_no_count_is_the_sharpest() -> None:
    ratios = [
        (n, (0.3 + 0.0024 * n) / (0.2 + 0.0016 * n) * e) for n in (1, 10, 100, 1000) for e in (1.01, 0.99)
    ]
    c = pm.paired_crossover(ratios, (1, 1000))
    assert c is not None and c.paired is not None and c.resolved is None and c.paired.sharpest is None
