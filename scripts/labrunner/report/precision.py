"""--precision: how sharp each compared throughput ratio of a run is, and which groups another
repeat would sharpen, so a run adds rounds until every ratio's interval is as narrow as asked."""

from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.report.compare import Group
from labrunner.report.findings import saturation_comparisons
from labrunner.report.floor import lab_groups
from labrunner.report.stats import CONFIDENCE, Ratio


@dataclass(frozen=True)
class Sharpness:
    """One compared pair's req/s ratio and how far its interval reaches from the estimate."""

    question: str
    candidate: Group
    baseline: Group
    half_width: float | None  # a share of the estimate; None: no interval yet (one repeat)

    def reached(self, precision: float) -> bool:
        return self.half_width is not None and self.half_width <= precision

    @property
    def pair(self) -> str:
        return f"{self.candidate.target} vs {self.baseline.target}"


def half_width(r: Ratio) -> float | None:
    """How far the interval reaches from the estimate, as a share of it, on its wider side:
    [0.95, 1.05] around 1.00 is 0.05. None without an interval."""
    if r.low is None or r.high is None:
        return None
    return max(r.high / r.estimate, r.estimate / r.low) - 1


def sharpness(groups: Sequence[Group]) -> list[Sharpness]:
    """Every compared saturation pair of the run's own targets (the floor's excluded), with the half
    width of its req/s ratio's interval."""
    found = []
    for question, c in saturation_comparisons(lab_groups(groups)):
        r = c.ratios.get("rps")
        found.append(Sharpness(question, c.candidate, c.baseline, half_width(r) if r else None))
    return found


def to_repeat(pairs: Sequence[Sharpness], precision: float) -> list[Group]:
    """The groups of every pair not yet within `precision`, each once, in the run's group order."""
    wanted: dict[str, Group] = {}
    for p in pairs:
        if not p.reached(precision):
            wanted.setdefault(p.candidate.id, p.candidate)
            wanted.setdefault(p.baseline.id, p.baseline)
    return sorted(wanted.values(), key=lambda g: (g.order, g.id))


def outcome(pairs: Sequence[Sharpness], precision: float) -> str:
    """The end of a --precision run in one line: which pairs reached it and which did not."""
    missed = [p for p in pairs if not p.reached(precision)]
    head = (
        f"precision ±{precision:.0%} ({CONFIDENCE:.0%} interval of each compared req/s ratio): "
        f"{len(pairs) - len(missed)} of {len(pairs)} pairs reached it"
    )
    if not missed:
        return head
    widths = ", ".join(
        f"{p.pair} " + ("no interval" if p.half_width is None else f"±{p.half_width:.1%}") for p in missed
    )
    return f"{head}; not: {widths}"
