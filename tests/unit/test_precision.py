"""--precision's rules on synthetic results: how far a ratio's interval reaches, which groups another
repeat would sharpen, and the line that ends the run."""

import pytest
from labrunner.report import precision
from labrunner.report.compare import Group, group_results
from labrunner.report.findings.pairs import saturation_comparisons
from labrunner.report.stats import Ratio, relative_half_width
from labrunner.results.result import parse_results

from tests.unit.test_findings import _result, _run


def test_half_width_is_the_wider_side_as_a_share_of_the_estimate() -> None:
    assert relative_half_width(Ratio(1.0, 0.95, 1.05, 0.5, False)) == pytest.approx(0.0526, abs=1e-4)
    assert relative_half_width(Ratio(2.0, 1.8, 2.1, 0.01, True)) == pytest.approx(2.0 / 1.8 - 1)
    assert relative_half_width(Ratio(2.0, None, None, None, None, "n/a: one repeat")) is None


def test_only_the_groups_of_pairs_not_yet_sharp_are_repeated() -> None:
    # grpc vs aiohttp-h1 and aiohttp-h1 vs quart-h1 are tight; grpc vs quart-h1 too, but
    # quart-h1-tls vs quart-h2-tls (HTTP/2 vs HTTP/1.1) spreads.
    groups = group_results(
        parse_results(
            _run({"grpc": [600, 601, 599], "aiohttp-h1": [1500, 1501, 1499], "quart-h1": [400, 401, 399]})
            + _run({"quart-h1-tls": [300, 360, 250], "quart-h2-tls": [200, 201, 199]})
        )
    )
    pairs = precision.sharpness(groups)
    assert {p.pair for p in pairs if not p.reached(0.05)} == {"quart-h2-tls vs quart-h1-tls"}
    assert [g.target for g in precision.to_repeat(pairs, 0.05)] == ["quart-h1-tls", "quart-h2-tls"]
    assert precision.to_repeat(pairs, 0.9) == []  # every pair within ±90%
    line = precision.outcome(pairs, 0.05)
    assert line.startswith(
        f"precision ±5% (95% interval of each compared req/s and CPU/req ratio): {len(pairs) - 1} of "
    )
    assert "; not: quart-h2-tls vs quart-h1-tls ±" in line
    assert precision.outcome(pairs, 0.9).endswith(f"{len(pairs)} of {len(pairs)} pairs reached it")


def test_one_repeat_has_no_interval_and_is_repeated() -> None:
    groups = group_results(parse_results(_run({"grpc": [600], "quart-h1": [400]})))
    [pair] = precision.sharpness(groups)
    assert pair.half_width is None and not pair.reached(0.5)
    assert "not: grpc vs quart-h1 no interval" in precision.outcome([pair], 0.05)


def test_rounds_to_go_read_the_interval_now_and_optimistically_its_spread_at_its_lower_bound() -> None:
    near, far, farthest = (
        precision.Sharpness("q", *_two_groups(), width, rounds=3) for width in (0.06, 0.15, 0.60)
    )
    # ±6% from three rounds: a fourth brings it within ±5% (t falls from 4.30 to 3.18).
    assert precision.rounds_to_go(near, 0.05) == 1
    assert precision.rounds_to_go(far, 0.05) == 5
    assert precision.rounds_to_go(far, 0.05, optimistic=True) == 2
    assert precision.rounds_to_go(farthest, 0.05) == 58
    assert precision.rounds_to_go(farthest, 0.05, optimistic=True) == 25
    # No interval yet: the one round that gives it one.
    assert precision.rounds_to_go(precision.Sharpness("q", *_two_groups(), None), 0.05) == 1


def test_rounds_go_to_the_pairs_the_budget_left_can_bring_within_their_target() -> None:
    near, far, farthest, done = (
        precision.Sharpness(f"q{width}", *_two_groups(), width, rounds=3)
        for width in (0.06, 0.15, 0.60, 0.04)
    )
    pairs = [farthest, far, done, near]

    def ten_seconds(pair: precision.Sharpness) -> float:
        return 10.0

    # 60 s: near's round (10 s) and far's five (50 s); farthest's 58 (25 optimistically) are out of reach.
    assert precision.within_reach(pairs, 0.05, 60.0, ten_seconds) == [near, far]
    # 30 s: far's five rounds do not fit beside near's; on its spread's lower bound two would.
    assert precision.within_reach(pairs, 0.05, 30.0, ten_seconds) == [near]
    assert precision.within_reach([far, farthest], 0.05, 30.0, ten_seconds) == [far]
    # 5 s: not one round; the budget's last round then goes to the nearest (precision_rounds).
    assert precision.within_reach(pairs, 0.05, 5.0, ten_seconds) == []


def _two_groups() -> tuple[Group, Group]:
    a, b = group_results(parse_results(_run({"grpc": [600, 601], "quart-h1": [400, 401]})))[:2]
    return a, b


def test_a_pair_is_as_sharp_as_the_wider_of_its_req_s_and_cpu_per_request_intervals() -> None:
    # req/s exactly 1.5x in every round, while grpc's CPU per request moves ±10% from round to round.
    grpc = [
        _result("grpc", i + 1, 600, cpu_per_request_s=cpu) for i, cpu in enumerate((0.0009, 0.0011, 0.001))
    ]
    groups = group_results(parse_results(grpc + _run({"quart-h1": [400, 400, 400]})))
    [pair] = precision.sharpness(groups)
    [closed] = [c for _, c in saturation_comparisons(groups)]
    assert relative_half_width(closed.ratios["rps"]) == pytest.approx(0.0, abs=1e-9)
    cpu = relative_half_width(closed.ratios["cpu_per_1k"])
    assert cpu is not None and cpu > 0.2
    assert pair.half_width == cpu and not pair.reached(0.05) and pair.rounds == 3
