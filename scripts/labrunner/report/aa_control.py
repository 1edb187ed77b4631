"""The A/A control of a duet run (model.duet): one target beside itself, side 1 over side 2. Both
sides are the same code, so a ratio away from 1 is what the duet itself adds to every ratio of the
run (slot, start order, a process's own layout) beyond what swapping the slots removed."""

from collections.abc import Sequence

from labrunner.report.compare import AA_CONTROL, Comparison, Group, compare_groups
from labrunner.report.stats import Ratio

# The control says the run's ratios carry a bias when its interval excludes 1, or when its centre is
# off by more than this: a few percent is what a fresh process's layout alone moves a side by.
BIAS_TOLERANCE = 0.02
# The half width asked of a control whose centre leaves it (almost) no room within ±BIAS_TOLERANCE:
# hundreds of blocks, more than any budget holds (settling_half_width).
UNSETTLED = 0.001


def controls(groups: Sequence[Group]) -> list[Comparison]:
    return [c for c in compare_groups(groups) if c.kind == AA_CONTROL]


def bias(control: Comparison) -> float | None:
    """How far the control's req/s ratio is from 1 (0.03: 3%) when it shows a bias, None when not."""
    r = control.ratios.get("rps")
    return None if r is None else ratio_bias(r)


def ratio_bias(r: Ratio) -> float | None:
    """How far an A/A ratio is from 1 when it shows a bias (its interval excludes 1, or its centre is
    off by more than BIAS_TOLERANCE), None when not."""
    off = abs(r.estimate - 1.0)
    return off if _excludes_one(r) or off > BIAS_TOLERANCE else None


def settling_half_width(r: Ratio) -> float:
    """The half width (relative_half_width) at which an A/A ratio with r's centre settles: its interval
    within ±BIAS_TOLERANCE of 1 (no slot bias beyond it). 0.02 at a centre of 1.000, 0.0129 at 1.007,
    0.005 at 1.015; UNSETTLED, as good as never, from where that leaves less. --precision sharpens a
    control to it.

    An interval clear of 1 does not settle it: a control stopped at the first block that shows a bias
    would show one that is not there in 12-20% of runs (blocks spreading 2-3%, a look after each block
    from the third: a simulation of 4,000 runs), against the 5% of a fixed count; stopped only within
    ±BIAS_TOLERANCE, 5-7%. A control whose centre keeps it beyond that gets no blocks the pairs need
    (precision.within_reach), and its verdict says the bias its interval shows."""
    within = min((1 + BIAS_TOLERANCE) / r.estimate, r.estimate / (1 - BIAS_TOLERANCE)) - 1
    return max(within, UNSETTLED)


def verdict(r: Ratio) -> str:
    """What an A/A ratio says of the run's other ratios, as far as its interval can tell: a bias it
    shows (one its interval holds 1 beside is only possible), else the widest bias it rules out
    (±BIAS_TOLERANCE once its interval reaches no further from 1; until then more blocks are what it
    needs, whether its width or its centre's offset keeps it from there)."""
    off = ratio_bias(r)
    if off is not None:
        if _excludes_one(r):
            return f"the run's duet ratios carry a bias of about {off:.1%}"
        return f"the run's duet ratios may carry a bias of about {off:.1%} (its interval holds 1)"
    if r.low is None or r.high is None:
        return "no interval yet: a bias is neither shown nor ruled out"
    reach = round(max(r.high - 1.0, 1.0 - r.low), 3)  # as printed: 0.1% steps
    if reach <= BIAS_TOLERANCE:
        return f"no slot bias beyond ±{BIAS_TOLERANCE:.0%}"
    return f"no slot bias beyond ±{reach:.1%} (±{BIAS_TOLERANCE:.0%} needs more blocks)"


def _excludes_one(r: Ratio) -> bool:
    return r.low is not None and r.high is not None and not r.low <= 1.0 <= r.high
