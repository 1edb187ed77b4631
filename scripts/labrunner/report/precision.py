"""--precision: how sharp each compared throughput ratio of a run is, and which groups another
repeat would sharpen, so a run adds rounds until every ratio's interval is as narrow as asked.

The A/A control is sharpened too, to its own bound: a control within ±5% cannot rule out the 2% slot
bias it is there to find (report.aa_control), so it asks for ±2% whatever --precision asks above."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.report import aa_control
from labrunner.report.compare import AA_CONTROL, Group
from labrunner.report.findings.pairs import saturation_comparisons
from labrunner.report.floor import lab_groups
from labrunner.report.stats import CONFIDENCE, Ratio


@dataclass(frozen=True)
class Sharpness:
    """One compared pair's req/s ratio and how far its interval reaches from the estimate."""

    question: str
    candidate: Group
    baseline: Group
    half_width: float | None  # a share of the estimate; None: no interval yet (one repeat)
    ceiling: float | None = None  # the widest it may be whatever --precision asks (the A/A control's)

    def target(self, precision: float) -> float:
        return precision if self.ceiling is None else min(precision, self.ceiling)

    def reached(self, precision: float) -> bool:
        return self.half_width is not None and self.half_width <= self.target(precision)

    @property
    def pair(self) -> str:
        if self.question == AA_CONTROL:
            return f"A/A control {self.candidate.target}"
        return f"{self.candidate.target} vs {self.baseline.target}"


def half_width(r: Ratio) -> float | None:
    """How far the interval reaches from the estimate, as a share of it, on its wider side:
    [0.95, 1.05] around 1.00 is 0.05. None without an interval."""
    if r.low is None or r.high is None:
        return None
    return max(r.high / r.estimate, r.estimate / r.low) - 1


def sharpness(groups: Sequence[Group]) -> list[Sharpness]:
    """Every compared saturation pair of the run's own targets (the floor's excluded), then each A/A
    control with its bias bound as a ceiling, with the half width of its req/s ratio's interval."""
    found = []
    for question, c in saturation_comparisons(lab_groups(groups)):
        r = c.ratios.get("rps")
        found.append(Sharpness(question, c.candidate, c.baseline, half_width(r) if r else None))
    for control in aa_control.controls(groups):
        r = control.ratios.get("rps")
        width = half_width(r) if r else None
        found.append(
            Sharpness(AA_CONTROL, control.candidate, control.baseline, width, aa_control.BIAS_TOLERANCE)
        )
    return found


def to_repeat(pairs: Sequence[Sharpness], precision: float) -> list[Group]:
    """The groups of every pair not yet within `precision`, each once, in the run's group order."""
    wanted: dict[str, Group] = {}
    for p in pairs:
        if not p.reached(precision):
            wanted.setdefault(p.candidate.id, p.candidate)
            wanted.setdefault(p.baseline.id, p.baseline)
    return sorted(wanted.values(), key=lambda g: (g.order, g.id))


def distance(pairs: Sequence[Sharpness], precision: float) -> dict[str, float]:
    """Each group of a pair not yet within `precision`: how far the nearest such pair it is in still
    is from its target, its half width over the target (inf without an interval)."""
    far: dict[str, float] = {}
    for p in pairs:
        if p.reached(precision):
            continue
        ratio = math.inf if p.half_width is None else p.half_width / p.target(precision)
        for group in (p.candidate.id, p.baseline.id):
            far[group] = min(far.get(group, math.inf), ratio)
    return far


def outcome(pairs: Sequence[Sharpness], precision: float) -> str:
    """The end of a --precision run in one line: which pairs reached it and which did not, and
    whether each A/A control reached its own bound."""
    compared = [p for p in pairs if p.question != AA_CONTROL]
    missed = [p for p in compared if not p.reached(precision)]
    line = (
        f"precision ±{precision:.0%} ({CONFIDENCE:.0%} interval of each compared req/s ratio): "
        f"{len(compared) - len(missed)} of {len(compared)} pairs reached it"
    )
    if missed:
        line += "; not: " + ", ".join(f"{p.pair} {_width(p)}" for p in missed)
    for control in (p for p in pairs if p.question == AA_CONTROL):
        verdict = "reached" if control.reached(precision) else f"not reached ({_width(control)})"
        line += f"; {control.pair} ±{control.target(precision):.0%}: {verdict}"
    return line


def _width(pair: Sharpness) -> str:
    return "no interval" if pair.half_width is None else f"±{pair.half_width:.1%}"
