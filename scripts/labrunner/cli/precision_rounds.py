"""--precision: rounds of one more block of the compared pairs not yet within the precision that
--budget's time left can bring there, and the manifest's account of them."""

import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from labrunner.cli.session_config import SessionConfig
from labrunner.model import duet
from labrunner.model.scenario import Plan, Scenario, units_of
from labrunner.report import aa_control, precision
from labrunner.report.compare import Group, group_results
from labrunner.results.store import (
    load_results,
)
from labrunner.say import Say

# What a scenario (a duet: a block) adds beyond k6's time when a round's length is estimated against
# the budget: its services' starts, checks and k6's start. A default run on a 2-vCPU VM (2026-12-06)
# took 170 s for 17 precision blocks of 1 s + 5 s: 4 s each beyond k6's 6.
ROUND_OVERHEAD_S = 4.0


def sharpen(
    plan: Plan,
    config: SessionConfig,
    order: list[str],
    *,
    run_unit: Callable[[int, tuple[Scenario, ...]], None],
    settle: Callable[[], None],
    extend: Callable[[Sequence[Scenario]], int],
    say: Say,
) -> list[str]:
    """--precision: rounds of one more repeat of the closed groups of the pairs whose req/s or CPU per
    request ratio is not yet within the precision (an A/A control: until it settles) and that
    the budget left can still bring there (precision.within_reach); when none can, a last round of
    the duet blocks nearest their target that fit (each round shuffled by the run's seed and its
    number). The ids it adds join `order` (the matrix's, in which pairs are read, so which side of a
    pair is the candidate never depends on the order they ran in); returns them."""
    assert config.precision is not None
    target, out = config.precision, config.run.out_dir
    deadline = time.monotonic() + config.budget_s
    closed = {s.group: s for s in plan.scenarios if s.load_model.rung is None}
    added: list[str] = []
    for number in itertools.count(1):
        results = load_results(out, order)
        pairs = precision.sharpness(group_results(results))
        last = {r.scenario.group: r.scenario.repeat for r in sorted(results, key=lambda r: r.scenario.repeat)}
        left = deadline - time.monotonic()
        chosen = precision.within_reach(pairs, target, left, _round_cost(closed, last))
        bounds = _bounds(pairs, target)
        units = units_of(_next(closed, last, precision.to_repeat(chosen, target)))  # a duet: one block
        if units:
            say(f"precision: round {number}: one more repeat of {_which(pairs, chosen, target, bounds)}")
        else:
            # No pair can get there in the budget left: its last round goes to the duet blocks of the
            # pairs nearest their target, as many as fit (a sequential pair's ratio needs both sides'
            # repeats of one round: none).
            open_round = _next(closed, last, precision.to_repeat(pairs, target))
            blocks = [u for u in units_of(open_round) if len(u) == 2]
            units = nearest_that_fit(blocks, precision.distance(pairs, target), left)
            if not units:
                if open_round:
                    size = f"{len(open_round)} scenarios, {round_seconds(units_of(open_round)):.0f} s"
                    say(f"precision: round {number} ({size}) would outlast --budget")
                return added
            which = "the pair nearest" if len(units) == 1 else f"the {len(units)} pairs nearest"
            say(f"precision: round {number}, the last the budget holds: one more block of {which} {bounds}")
        random.Random(f"{plan.seed}-precision-{number}").shuffle(units)
        index = extend([s for unit in units for s in unit])
        for unit in units:
            run_unit(index, unit)
            index += len(unit)
            added += [s.id for s in unit]
            order += [s.id for s in unit]
        settle()
    raise AssertionError("unreachable: itertools.count never ends")


def _bounds(pairs: Sequence[precision.Sharpness], target: float) -> str:
    """What the pairs are sharpened to, in words: "±5% (an A/A control: within ±2% of 1)", and for a
    payload crossover its own bound; a payload target's a and b (precision.cost_lines) take --precision's."""
    bounds = f"an A/A control: within ±{aa_control.BIAS_TOLERANCE:.0%} of 1"
    if any(p.question == precision.CROSSOVER for p in pairs):
        bounds += f"; a crossover: within {precision.CROSSOVER_FACTOR}x end to end"
    if any(p.question in (precision.FIXED, precision.PER_RECORD) for p in pairs):
        bounds += "; each payload target's a and b as the ratios"
    return f"±{target:.0%} ({bounds})"


def _next(closed: dict[str, Scenario], last: dict[str, int], groups: Sequence[Group]) -> list[Scenario]:
    """The next repeat (a duet's next block) of each closed group among `groups`."""
    return [duet.next_block(closed[g.id], last[g.id] + 1) for g in groups if g.id in closed]


def _round_cost(closed: dict[str, Scenario], last: dict[str, int]) -> Callable[[precision.Sharpness], float]:
    """How long one more round of a pair takes (round_seconds)."""

    def cost(pair: precision.Sharpness) -> float:
        return round_seconds(units_of(_next(closed, last, pair.groups)))

    return cost


def _which(
    pairs: Sequence[precision.Sharpness], chosen: Sequence[precision.Sharpness], target: float, bounds: str
) -> str:
    """The pairs a round goes to, and how many are beyond the budget left, with their rounds to go
    (the end of the run names the pairs that did not get there)."""
    beyond = sorted(
        precision.rounds_to_go(p, target) for p in pairs if not p.reached(target) and p not in chosen
    )
    which = f"the {len(chosen)} of {len(chosen) + len(beyond)} pairs not yet within {bounds} that the budget "
    which += "left can bring there"
    if beyond:
        more = f"{beyond[0]}" if beyond[0] == beyond[-1] else f"{beyond[0]} to {beyond[-1]}"
        which += f"; beyond it: {len(beyond)}, {more} more each"
    return which


def nearest_that_fit(
    blocks: Sequence[tuple[Scenario, ...]], distance: dict[str, float], seconds: float
) -> list[tuple[Scenario, ...]]:
    """Duet blocks of the groups nearest their target first (precision.distance), as many as `seconds`
    holds by round_seconds' estimate: the budget's last, partial round goes where a block is likeliest
    to bring a pair within its target."""
    chosen: list[tuple[Scenario, ...]] = []
    used = 0.0
    for block in sorted(blocks, key=lambda b: min(distance.get(s.group, math.inf) for s in b)):
        if used + (cost := round_seconds([block])) <= seconds:
            chosen.append(block)
            used += cost
    return chosen


def round_seconds(units: Sequence[tuple[Scenario, ...]]) -> float:
    """How long a round of `units` takes, as its budget check estimates it: each unit one after
    another, a duet's two sides at once (the longer of the two), plus each unit's start and stop."""
    return sum(max(s.warmup_s + s.measured_seconds for s in unit) + ROUND_OVERHEAD_S for unit in units)


def precision_record(
    config: SessionConfig, pairs: Sequence[precision.Sharpness], added: int
) -> dict[str, Any]:
    """The manifest's account of --precision: what was asked, what it added, which pairs reached it."""
    assert config.precision is not None
    return {
        "target": config.precision,
        "budget_s": config.budget_s,
        "scenarios_added": added,
        "pairs": [
            {
                "pair": p.pair,
                "question": p.question,
                "half_width": p.half_width,
                "target": p.target(config.precision),
                "reached": p.reached(config.precision),
            }
            for p in pairs
        ],
    }
