"""--precision's rules on synthetic results: how far a ratio's interval reaches, which groups another
repeat would sharpen, and the line that ends the run."""

import pytest
from labrunner.report import precision
from labrunner.report.compare import Group, group_results
from labrunner.report.findings.pairs import saturation_comparisons
from labrunner.report.payload_sweep import sweeps
from labrunner.report.stats import Ratio, relative_half_width
from labrunner.results.result import parse_results

from tests.unit.test_findings import _result, _run
from tests.unit.test_payload_model import _affine, _drifting, _groups


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


def _sweep_groups(grpc: dict[int, list[float]], rest: dict[int, list[float]]) -> list[Group]:
    return [g for side in _groups({"grpc": grpc, "aiohttp-h1": rest}).values() for g in side]


def test_a_payload_crossover_wider_than_its_bound_sends_blocks_to_the_count_that_narrows_it_most() -> None:
    # gRPC 0.3 + 0.0017 n ms against REST 0.35 + 0.0009 n: they cross at 62.5 records, between 10 and
    # 100, and three rounds whose host moves ±25% place it from the rounds' paired ratios; REST's
    # rounds 5% apart on top of that leave the crossover at 62 records [47, 84], 1.81x end to end. A
    # block at 100 records narrows it most (RatioModel.sharpest): a round is that block alone.
    grpc = _drifting(0.3, 0.0017, "grpc")
    rest = _drifting(0.35, 0.0009, "aiohttp-h1")
    noisy = {n: [c * f for c, f in zip(costs, (1.05, 0.95, 1.0), strict=True)] for n, costs in rest.items()}
    groups = _sweep_groups(grpc, noisy)
    entries = precision.crossovers(sweeps(groups, None))
    # --precision reads the crossover, then each target's a and b, from one reading of the sweeps.
    assert [p.question for p in precision.payload_entries(groups)] == [
        precision.CROSSOVER,
        *(precision.FIXED, precision.PER_RECORD) * 2,
    ]
    assert [[(g.target, g.count) for g in p.groups] for p in entries] == [
        [("grpc", 100), ("aiohttp-h1", 100)]
    ]
    (sweep,) = sweeps(groups, None)
    crossover = sweep.crossover
    assert crossover is not None and crossover.interval is not None and crossover.paired is not None
    assert crossover.paired.sharpest == 100
    low, high = crossover.interval
    assert high / low == pytest.approx(1.81, abs=0.01)
    for p in entries:
        assert p.question == precision.CROSSOVER and p.pair == "grpc vs aiohttp-h1 crossover"
        assert p.half_width is not None and (1 + p.half_width) ** 2 == pytest.approx(high / low)
        assert (1 + p.target(0.05)) ** 2 == pytest.approx(precision.CROSSOVER_FACTOR)  # whatever asked
        assert p.rounds == 3 and p.rounds - 1 + p.prior_df == crossover.paired.df
        assert not p.reached(0.05) and precision.rounds_to_go(p, 0.05) >= 1
    assert sorted((g.target, g.count) for g in precision.to_repeat(entries, 0.05)) == [
        ("aiohttp-h1", 100),
        ("grpc", 100),
    ]
    assert precision.outcome(entries, 0.05) == (
        "precision ±5% (95% interval of each compared req/s and CPU/req ratio): 0 of 0 pairs reached it; "
        "grpc vs aiohttp-h1 crossover: interval 1.81x end to end, not within 1.5x"
    )
    # Without REST's extra 5% the interval is 1.32x: within its bound, it sends no blocks.
    sharp = precision.crossovers(sweeps(_sweep_groups(grpc, rest), None))
    assert len(sharp) == 1 and sharp[0].reached(0.05) and precision.to_repeat(sharp, 0.05) == []
    assert precision.outcome(sharp, 0.05).endswith("interval 1.32x end to end, within 1.5x")
    # A crossover beyond the counts measured sends none: no counts either side of it.
    beyond = _sweep_groups(_drifting(0.5, 0.002, "grpc"), _drifting(0.2, 0.0021, "aiohttp-h1"))
    assert precision.crossovers(sweeps(beyond, None)) == []


def test_a_crossover_the_ratios_below_a_bend_do_not_place_sends_blocks_to_the_counts_it_lies_between() -> (
    None
):
    # gRPC 0.3 + 0.0017 n ms against REST 0.372 + 0.0009 n, 1.8x its line at 1,000 records: they
    # cross at 90 records, which the ratios at 1-100 place no closer than reaching past 100, so no
    # crossover is resolved; the costs change order between 10 and 100, where blocks would place it.
    rest = _drifting(0.372, 0.0009, "aiohttp-h1")
    rest[1000] = [c * 1.8 for c in rest[1000]]
    groups = _sweep_groups(_drifting(0.3, 0.0017, "grpc"), rest)
    (sweep,) = sweeps(groups, None)
    assert sweep.crossover is not None and sweep.crossover.resolved is None
    assert sweep.crossover.segment == (10, 100)
    (entry,) = entries = precision.crossovers(sweeps(groups, None))
    assert [g.count for g in entry.groups] == [10, 10, 100, 100] and entry.half_width is None
    assert precision.rounds_to_go(entry, 0.05) == 1 and not entry.reached(0.05)
    assert precision.outcome(entries, 0.05).endswith(
        "; grpc vs aiohttp-h1 crossover: not placed between its counts"
    )
    # Between 100 and 1,000 records, beside the bend, the ratios below it never would: no blocks, though
    # the lines fitted apart through those two counts resolve one.
    near = _drifting(0.2, 0.0021, "aiohttp-h1")
    near[1000] = [c * 1.2 for c in near[1000]]
    beside = _sweep_groups(_drifting(0.5, 0.002, "grpc"), near)
    (sweep,) = sweeps(beside, None)
    assert sweep.crossover is not None and sweep.crossover.segment == (100, 1000)
    assert precision.crossovers(sweeps(beside, None)) == []


def test_a_target_s_a_or_b_wider_than_the_precision_sends_blocks_to_the_count_that_pins_it() -> None:
    # gRPC exactly 0.3 + 0.0017 n ms; aiohttp 0.35 + 0.0009 n with its 1,000-record repeats ±12%: its
    # b, pinned by the most records a call, is ±9.7%, its a ±4.5%, gRPC's exact.
    rest = _affine(0.35, 0.0009, {1000: (1.12, 0.88, 1.0)})
    entries = precision.cost_lines(sweeps(_sweep_groups(_affine(0.3, 0.0017), rest), None))
    assert [(p.pair, p.question) for p in entries] == [
        ("grpc a", precision.FIXED),
        ("grpc b", precision.PER_RECORD),
        ("aiohttp-h1 a", precision.FIXED),
        ("aiohttp-h1 b", precision.PER_RECORD),
    ]
    widths = [p.half_width for p in entries]
    assert widths == pytest.approx([0, 0, 0.045, 0.097], abs=0.001)
    # A block beside the partner at the count that pins it: one, for the 12 points' 10 degrees of
    # freedom, of which that count's 3 repeats give 2 and the line's others 8.
    assert [[(g.target, g.count) for g in p.groups] for p in entries] == [
        [("grpc", 1), ("aiohttp-h1", 1)],
        [("grpc", 1000), ("aiohttp-h1", 1000)],
        [("aiohttp-h1", 1), ("grpc", 1)],
        [("aiohttp-h1", 1000), ("grpc", 1000)],
    ]
    assert all(p.rounds == 3 and p.prior_df == 8 for p in entries)
    # To --precision, as the ratios: at ±10% all four are within it, at ±5% aiohttp's b is not.
    assert precision.to_repeat(entries, 0.10) == []
    assert sorted((g.target, g.count) for g in precision.to_repeat(entries, 0.05)) == [
        ("aiohttp-h1", 1000),
        ("grpc", 1000),
    ]
    assert precision.rounds_to_go(entries[3], 0.05) > 1
    assert precision.outcome(entries, 0.05).endswith(
        "; payload a and b: 3 of 4 within ±5%; not: aiohttp-h1 b ±9.7%"
    )
