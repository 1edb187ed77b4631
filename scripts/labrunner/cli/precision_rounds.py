"""--precision: rounds of one more block of each compared pair not yet within the precision, while
--budget holds the next round, and the manifest's account of them."""

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
from labrunner.report.compare import group_results
from labrunner.results.store import (
    load_results,
)
from labrunner.say import Say

# What a scenario adds beyond k6's time when a round's length is estimated against the budget.
ROUND_OVERHEAD_S = 2.0


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
    """--precision: rounds of one more repeat of every closed group in a pair whose req/s ratio is
    not yet within the precision (an A/A control: within its own bound), while the budget holds the
    next round (each shuffled by the run's seed and its number). The ids it adds join `order` (the
    matrix's, in which pairs are read, so which side of a pair is the candidate never depends on the
    order they ran in); returns them."""
    assert config.precision is not None
    out, deadline = config.run.out_dir, time.monotonic() + config.budget_s
    closed = {s.group: s for s in plan.scenarios if s.load_model.rung is None}
    added: list[str] = []
    for number in itertools.count(1):
        results = load_results(out, order)
        pairs = precision.sharpness(group_results(results))
        groups = precision.to_repeat(pairs, config.precision)
        last_repeat = {
            r.scenario.group: r.scenario.repeat for r in sorted(results, key=lambda r: r.scenario.repeat)
        }
        round_ = [duet.next_block(closed[g.id], last_repeat[g.id] + 1) for g in groups if g.id in closed]
        if not round_:
            return added
        units = units_of(round_)  # a duet's two sides run as one block
        needed, whole = round_seconds(units), len(units)
        partial = time.monotonic() + needed > deadline
        if partial:
            # The last round the budget holds: the duet blocks of the pairs nearest their target, as
            # many as fit (a sequential pair's ratio needs both sides' repeats of one round: none).
            blocks = [unit for unit in units if len(unit) == 2]
            far = precision.distance(pairs, config.precision)
            units = nearest_that_fit(blocks, far, deadline - time.monotonic())
            if not units:
                size = f"{len(round_)} scenarios, {needed:.0f} s"
                say(f"precision: round {number} ({size}) would outlast --budget")
                return added
        random.Random(f"{plan.seed}-precision-{number}").shuffle(units)
        bounds = f"±{config.precision:.0%} (an A/A control: within ±{aa_control.BIAS_TOLERANCE:.0%})"
        if partial:
            which = f"the {len(units)} of {whole} pairs nearest"
            say(f"precision: round {number}, the last the budget holds: one more block of {which} {bounds}")
        else:
            which = f"the {len(round_)} groups of the pairs not yet within"
            say(f"precision: round {number}: one more repeat of {which} {bounds}")
        index = extend([s for unit in units for s in unit])
        for unit in units:
            run_unit(index, unit)
            index += len(unit)
            added += [s.id for s in unit]
            order += [s.id for s in unit]
        settle()
    raise AssertionError("unreachable: itertools.count never ends")


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
