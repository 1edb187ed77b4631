"""The A/A control of a duet run (model.duet): one target beside itself, side 1 over side 2. Both
sides are the same code, so a ratio away from 1 is what the duet itself adds to every ratio of the
run (slot, start order, a process's own layout) beyond what swapping the slots removed."""

from collections.abc import Sequence

from labrunner.report.compare import AA_CONTROL, Comparison, Group, compare_groups

# The control says the run's ratios carry a bias when its interval excludes 1, or when its centre is
# off by more than this: a few percent is what a fresh process's layout alone moves a side by.
BIAS_TOLERANCE = 0.02


def controls(groups: Sequence[Group]) -> list[Comparison]:
    return [c for c in compare_groups(groups) if c.kind == AA_CONTROL]


def bias(control: Comparison) -> float | None:
    """How far the control's req/s ratio is from 1 (0.03: 3%) when it shows a bias, None when not."""
    r = control.ratios.get("rps")
    if r is None:
        return None
    excludes_one = r.low is not None and r.high is not None and not r.low <= 1.0 <= r.high
    off = abs(r.estimate - 1.0)
    return off if excludes_one or off > BIAS_TOLERANCE else None
