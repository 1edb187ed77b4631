"""--precision: how sharp each compared throughput ratio of a run is (req/s and CPU per request),
and which groups another repeat would sharpen, so a run adds rounds until every ratio's interval is
as narrow as asked.

A budget rarely holds enough rounds for every pair, so the rounds go to the pairs the budget left can
still bring within the precision, those with the fewest rounds to go first (within_reach): one more
round of a pair that needs ten when five are left narrows it a little and brings none there.

The A/A control is sharpened too, to its own bound: a control within ±5% cannot rule out the 2% slot
bias it is there to find, so its req/s interval (the one its finding prints) asks for the width that
settles it at its centre whatever --precision asks above: within ±2% of 1
(report.aa_control.settling_half_width; an interval clear of 1 is no reason to stop).

So is a payload sweep's crossover between two counts, to its own bound whatever --precision asks: an
interval within CROSSOVER_FACTOR end to end. Where the blocks' ratios place it (payload_model's ratio
model), each block goes to the one count where it narrows the interval most (RatioModel.sharpest):
mostly the count nearest the crossing, whose ratio is near 1, or a farther one where the slope is
what is unknown. Where the two lines fitted apart place it, or nothing yet does, a round is a block at
each count either side.

And so are each sweep target's own a and b (payload_model.fit_target), to --precision as the ratios:
a is pinned by the fewest records a call, b by the most, so a block goes to that count."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scipy import special  # not scipy.stats: about 1 s to import (report/stats.py)

from labrunner.model.scenario import UPLOAD
from labrunner.report import aa_control
from labrunner.report.compare import AA_CONTROL, Comparison, Group
from labrunner.report.findings.pairs import saturation_comparisons
from labrunner.report.floor import lab_groups
from labrunner.report.stats import CONFIDENCE, relative_half_width
from labrunner.results.trust import rounds_needed

if TYPE_CHECKING:
    from labrunner.report.payload_sweep import Sweep

# How optimistic a pair's spread may be read before the budget left counts it out of reach: its
# standard deviation at its one-sided 90% lower confidence bound (chi-square). Three rounds estimate a
# spread within a factor of about 2, and a pair whose first rounds spread more than it does should not
# lose its rounds for it.
OPTIMISM = 0.9

CROSSOVER = "payload crossover"
# How wide a crossover's interval may be, high / low, before blocks go to the counts that place it.
CROSSOVER_FACTOR = 1.5
# A payload sweep target's fixed cost a and per-record cost b, each sharpened as a question of its own
# (cost_lines).
FIXED, PER_RECORD = "payload a", "payload b"


@dataclass(frozen=True)
class Sharpness:
    """One compared pair's throughput ratios and how far the wider interval reaches from the estimate."""

    question: str
    candidate: Group
    baseline: Group
    half_width: float | None  # a share of the estimate; None: no interval yet (one repeat)
    ceiling: float | None = None  # the widest it may be whatever --precision asks (the A/A control's)
    rounds: int | None = None  # the rounds its interval pairs
    prior_df: float = 0.0  # the degrees of freedom its spread borrowed from the run's pairs (stats.Ratio)
    verdict: str | None = None  # an A/A control's (report.aa_control.verdict)
    goal: float | None = None  # a bound of its own whatever --precision asks (a crossover's)
    # Groups a round repeats with the two (a crossover's: the other count's gRPC and REST groups).
    also: tuple[Group, ...] = ()

    @property
    def groups(self) -> tuple[Group, ...]:
        """The groups one round of it repeats: candidate, baseline and also."""
        return (self.candidate, self.baseline, *self.also)

    def target(self, precision: float) -> float:
        if self.goal is not None:
            return self.goal
        return precision if self.ceiling is None else min(precision, self.ceiling)

    def reached(self, precision: float) -> bool:
        return self.half_width is not None and self.half_width <= self.target(precision)

    @property
    def pair(self) -> str:
        if self.question == AA_CONTROL:
            return f"A/A control {self.candidate.target}"
        upload = ", uploading" if self.candidate.direction == UPLOAD else ""
        if self.question == CROSSOVER:
            return f"{self.candidate.target} vs {self.baseline.target} crossover{upload}"
        if self.question in (FIXED, PER_RECORD):
            return f"{self.candidate.target} {self.question.removeprefix('payload ')}{upload}"
        return f"{self.candidate.target} vs {self.baseline.target}"


def sharpness(groups: Sequence[Group]) -> list[Sharpness]:
    """Every compared saturation pair of the run's own targets (the floor's excluded), with the half
    width of the wider of its req/s and CPU per request ratios' intervals (a finding prints both);
    then each A/A control, by its req/s ratio (the one it prints), with the width that settles it as
    its ceiling (its own blocks' spread: a control borrows none)."""
    found = []
    for question, c in saturation_comparisons(lab_groups(groups)):
        width, rounds, prior_df = _widest(c)
        found.append(Sharpness(question, c.candidate, c.baseline, width, rounds=rounds, prior_df=prior_df))
    found += [_control(control) for control in aa_control.controls(groups)]
    return found + payload_entries(groups)


def payload_entries(groups: Sequence[Group]) -> list[Sharpness]:
    """Each payload sweep's crossover (crossovers), then each sweep target's a and b (cost_lines), from
    one reading of the run's sweeps; none for a run of one count."""
    if len({g.count for g in groups}) < 2:
        return []  # a sweep needs two counts or more (payload_sweep.sweeps)
    # Imported here: the cost model needs scipy.stats and scipy.optimize (about 1 s), which a run of
    # one count (the default preset's) then never imports.
    from labrunner.report import payload_sweep  # noqa: PLC0415

    pairs = payload_sweep.sweeps(groups, None)
    return crossovers(pairs) + cost_lines(pairs)


def crossovers(pairs: Sequence["Sweep"]) -> list[Sharpness]:
    """Each payload sweep's crossover between two of its counts, as one entry whose round repeats the
    (gRPC, REST) groups of the count where one more block narrows its interval most, when the ratio
    model placed it (RatioModel.sharpest), else of both counts either side of it, or where none is
    resolved, of the two between which the costs change order (Crossover.segment): blocks there are
    what would place it. Its half width is ln(high / low) / 2 as a share (the interval's reach either
    side of its centre on the log scale; None while it has no bounded interval, as a pair without one),
    its goal CROSSOVER_FACTOR end to end, its rounds the fewer blocks of its counts, and the degrees of
    freedom of the ratio model beyond those (prior_df), so that rounds_to_go takes t where the interval
    does (at one count it reads the interval as if that count's blocks alone set it: the other counts'
    share makes it narrow more slowly than that). No entry for a crossover outside the counts, a sweep
    whose costs keep one order, or a crossover sought between the largest count and the one below it
    (a line bends there, and payload_model places a crossover from the blocks' ratios only below it)."""
    found = []
    for sweep in pairs:
        c = sweep.crossover
        if c is None:
            continue
        counts = [g.count for g in sweep.grpc]
        if c.segment is not None and c.segment[1] == counts[-1]:
            continue  # beside the largest count, where a line bends: no blocks' ratios would place it
        either_side = _either_side(counts, c.resolved) if c.resolved is not None else c.segment
        if either_side is None:
            continue
        sharpest = c.paired.sharpest if c.paired is not None and c.resolved is not None else None
        low, high = either_side if sharpest is None else (sharpest, sharpest)
        grpc, rest = sweep.grpc[counts.index(low)], sweep.rest[counts.index(low)]
        also = () if high == low else (sweep.grpc[counts.index(high)], sweep.rest[counts.index(high)])
        rounds = min(len(g.results) for g in (grpc, rest, *also))
        half_width = None
        if c.resolved is not None and c.interval is not None and c.interval[0] > 0:
            half_width = math.sqrt(c.interval[1] / c.interval[0]) - 1
        df = c.paired.df if c.paired is not None else rounds - 1
        found.append(
            Sharpness(
                CROSSOVER,
                grpc,
                rest,
                half_width,
                rounds=rounds,
                prior_df=max(0, df - rounds + 1),
                goal=math.sqrt(CROSSOVER_FACTOR) - 1,
                also=also,
            )
        )
    return found


def cost_lines(pairs: Sequence["Sweep"]) -> list[Sharpness]:
    """Each payload sweep target's a and b (its cost line over every count, at the run's one speed), one
    entry each: a block of the target beside its partner at the count that pins it, the fewest records
    for a and the most for b (for gRPC, beside the REST server with the fewest blocks there); its
    rounds the target's repeats at that count and the line's other degrees of freedom its prior_df,
    so that rounds_to_go reads the interval as one that narrows with that count's repeats."""
    from labrunner.report import payload_sweep  # noqa: PLC0415 (payload_entries' reason)

    found = []
    for model, members in payload_sweep.fitted(pairs):
        for question, estimate, count in (
            (FIXED, model.line.fixed, model.counts[0]),
            (PER_RECORD, model.line.per_record, model.counts[-1]),
        ):
            own, beside = min(
                ((g, other) for g, other in members if g.count == count), key=lambda m: len(m[0].results)
            )
            rounds = sum(1 for n, _ in model.points if n == count)
            found.append(
                Sharpness(
                    question,
                    own,
                    beside,
                    estimate.relative_half_width,
                    rounds=rounds,
                    prior_df=max(0, model.line.df - rounds + 1),
                )
            )
    return found


def _either_side(counts: Sequence[int], records: float) -> tuple[int, int] | None:
    """The counts just below and just above records (one count twice when it is one); None outside."""
    below = [n for n in counts if n <= records]
    above = [n for n in counts if n >= records]
    return (below[-1], above[0]) if below and above else None


def _control(control: Comparison) -> Sharpness:
    """An A/A control's sharpness by its req/s ratio; without one (a side never measured), no interval."""
    rps = control.ratios.get("rps")
    if rps is None:
        return Sharpness(AA_CONTROL, control.candidate, control.baseline, None, aa_control.BIAS_TOLERANCE)
    return Sharpness(
        AA_CONTROL,
        control.candidate,
        control.baseline,
        relative_half_width(rps),
        aa_control.settling_half_width(rps),
        rps.rounds,
        verdict=aa_control.verdict(rps),
    )


def _widest(c: Comparison) -> tuple[float | None, int | None, float]:
    """A pair's wider half width of its req/s and CPU per request ratios (None while either has no
    interval; CPU per request only where it was measured), the rounds they pair, and the degrees of
    freedom the wider's spread borrowed from the run's pairs."""
    ratios = [r for r in (c.ratios.get("rps"), c.ratios.get("cpu_per_1k")) if r is not None]
    rounds = max((r.rounds for r in ratios if r.rounds is not None), default=None)
    widths = [(width, r) for r in ratios if (width := relative_half_width(r)) is not None]
    if not widths or len(widths) < len(ratios):
        return None, rounds, 0.0
    width, wider = max(widths, key=lambda found: found[0])
    return width, rounds, wider.prior_df


def rounds_to_go(pair: Sharpness, precision: float, *, optimistic: bool = False) -> int:
    """About how many more rounds bring a pair not yet within its target there (trust.rounds_needed,
    less the rounds it has); optimistic: with its spread at its OPTIMISM lower confidence bound. A pair
    without an interval from two rounds has one to go: the round that gives it one."""
    if pair.half_width is None or pair.rounds is None or pair.rounds < 2:
        return 1
    log_half_width = math.log1p(pair.half_width)
    if optimistic:
        df = pair.rounds - 1 + pair.prior_df
        log_half_width *= math.sqrt(df / float(special.chdtri(df, 1 - OPTIMISM)))
    needed = rounds_needed(log_half_width, pair.rounds, pair.target(precision), pair.prior_df)
    return max(1, needed - pair.rounds)


def within_reach(
    pairs: Sequence[Sharpness], precision: float, seconds: float, cost: Callable[[Sharpness], float]
) -> list[Sharpness]:
    """The pairs not yet within `precision` that the next round goes to: fewest rounds to go first, as
    many as `seconds` holds all their rounds to go (`cost`: one round of a pair), and at least the
    nearest whose rounds to go fit on an optimistic reading of its spread (rounds_to_go). Empty when
    no pair could get there in `seconds`: the budget's last round then goes to the nearest."""
    open_ = [p for p in pairs if not p.reached(precision)]
    hopeful = [p for p in open_ if rounds_to_go(p, precision, optimistic=True) * cost(p) <= seconds]
    chosen: list[Sharpness] = []
    used = 0.0
    for pair in sorted(hopeful, key=lambda p: rounds_to_go(p, precision)):
        needs = rounds_to_go(pair, precision) * cost(pair)
        if not chosen or used + needs <= seconds:
            chosen.append(pair)
            used += needs
    return chosen


def to_repeat(pairs: Sequence[Sharpness], precision: float) -> list[Group]:
    """The groups of every pair not yet within `precision`, each once, in the run's group order."""
    wanted: dict[str, Group] = {}
    for p in pairs:
        if not p.reached(precision):
            for group in p.groups:
                wanted.setdefault(group.id, group)
    return sorted(wanted.values(), key=lambda g: (g.order, g.id))


def distance(pairs: Sequence[Sharpness], precision: float) -> dict[str, float]:
    """Each group of a pair not yet within `precision`: how far the nearest such pair it is in still
    is from its target, its half width over the target (inf without an interval)."""
    far: dict[str, float] = {}
    for p in pairs:
        if p.reached(precision):
            continue
        ratio = math.inf if p.half_width is None else p.half_width / p.target(precision)
        for group in (g.id for g in p.groups):
            far[group] = min(far.get(group, math.inf), ratio)
    return far


def outcome(pairs: Sequence[Sharpness], precision: float) -> str:
    """The end of a --precision run in one line: which pairs reached it and which did not, and
    whether each A/A control reached its own bound."""
    compared = [p for p in pairs if p.question not in (AA_CONTROL, CROSSOVER, FIXED, PER_RECORD)]
    missed = [p for p in compared if not p.reached(precision)]
    line = (
        f"precision ±{precision:.0%} ({CONFIDENCE:.0%} interval of each compared req/s and CPU/req ratio): "
        f"{len(compared) - len(missed)} of {len(compared)} pairs reached it"
    )
    if missed:
        line += "; not: " + ", ".join(f"{p.pair} {_width(p)}" for p in missed)
    for control in (p for p in pairs if p.question == AA_CONTROL):
        line += f"; {control.pair}: {control.verdict or 'no interval yet'}"
    for crossover in (p for p in pairs if p.question == CROSSOVER):
        line += f"; {crossover.pair}: "
        if crossover.half_width is None:
            line += "not placed between its counts"
            continue
        within = "within" if crossover.reached(precision) else "not within"
        line += f"interval {(1 + crossover.half_width) ** 2:.2f}x end to end, {within} {CROSSOVER_FACTOR}x"
    costs = [p for p in pairs if p.question in (FIXED, PER_RECORD)]
    if costs:
        wide = [p for p in costs if not p.reached(precision)]
        line += f"; payload a and b: {len(costs) - len(wide)} of {len(costs)} within ±{precision:.0%}"
        line += "".join(f"{'; not: ' if i == 0 else ', '}{p.pair} {_width(p)}" for i, p in enumerate(wide))
    return line


def _width(pair: Sharpness) -> str:
    return "no interval" if pair.half_width is None else f"±{pair.half_width:.1%}"
