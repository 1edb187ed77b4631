"""The payload cost model: CPU per request = a + b·n for each target, and where gRPC and REST cross.

A request costs its server a fixed amount a (protocol and framework) plus b per record, so the
ratio of two targets' costs, (a1 + b1·n) / (a2 + b2·n), is S-shaped in log n: interpolating it
between the measured counts places its crossing of 1 too low (15-30% on exact affine costs).
Fitting the two lines and solving a1 + b1·n = a2 + b2·n does not, and its interval says how well
the sweep pins the crossover down. Costs are in ms per request (CPU seconds per 1,000 requests).
"""

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize, stats

from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD
from labrunner.report.compare import METRICS, Group
from labrunner.report.serialization import Case
from labrunner.report.stats import CONFIDENCE, EQUIVALENCE_MARGIN, paired_ratio, t_quantile
from labrunner.results.trust import SERVICE_CPU_BOUND

# Below this many degrees of freedom the paired ratios do not fit the ratio model: the lines fitted
# apart decide instead (three counts of two rounds have three).
PAIRED_MIN_DF = 3
# Below this p the ratio model's lack of fit rejects it: the crossover is then sought between counts.
LACK_OF_FIT = 0.05
CPU = "cpu_per_1k"  # CPU seconds per 1,000 requests: ms per request
REFERENCE = "reference_unit"  # the speed reference's CPU seconds per unit over a repeat's window
UTILISATION = "service_cpu"  # the service's share of its CPU quota over the window
METHOD = (
    "CPU per request (ms) is fitted for each target as a + b·n over every repeat at every count n: a is "
    "what one request costs (protocol and framework), b what one record adds. Weighted least squares, "
    "weights 1/m² with m the mean at that count: the repeats' spread grows with the level, and "
    "unweighted the 1,000-record repeats, whose spread exceeds a whole one-record request, would set a. "
    f"Intervals are {CONFIDENCE:.0%} Student t from the residuals (points - 2 degrees of freedom). The "
    "crossover n* = (a gRPC - a REST) / (b REST - b gRPC) comes from the rounds' paired ratios where "
    f"the run has them (three or more counts, {PAIRED_MIN_DF} or more degrees of freedom): gRPC / REST of "
    "each round (a duet block's two sides) fitted on the log scale as the ratio of the two lines, "
    "(a gRPC + b gRPC·n) / (a REST + b REST·n), and its interval every n* whose best model through it the "
    "ratios do not reject (the profile likelihood's F test), so a block the host slowed for both sides "
    "cancels, as in every ratio of a run; used where the ratio model's lack of fit against the rounds' "
    f"spread about their count's mean is not significant (F test, p >= {LACK_OF_FIT}). Where a line misses "
    "the check below, the ratio model is fitted to the rounds at the counts below the one it missed, the "
    "counts the check's line fitted, so the bend does not enter it, and used when its interval lies among "
    "those counts; the sentence then names the bend. Without paired rounds, where the two lines "
    "fitted apart meet, with "
    "Fieller's interval (the two fits independent, the fewer of their degrees of freedom). Both are "
    "unbounded exactly when the per-record costs are not told apart, which the delta method's "
    "symmetric interval hides and a bootstrap over 2-5 repeats has too few resamples to show. Check: "
    "each target fitted without its largest count predicts that count's mean; where a target's fit misses "
    f"it by more than ±{EQUIVALENCE_MARGIN:.0%}, its cost bends, and without the rounds' ratios below the "
    "bend to place it, no line over every count is used: the "
    "crossover is sought between the two adjacent counts where the targets' mean costs change order, "
    "from each one's line through those two counts' repeats alone (Fieller's interval the same way), and "
    "without a change of order the sweep says which costs more at every count; such a crossover's interval "
    "reaches no further than those two counts where the rounds' paired ratios at each are clear of 1 on "
    "opposite sides. Groups whose throughput is "
    "only a lower bound stay in the fit (what a request cost is still measured); counts whose service "
    f"used less than {SERVICE_CPU_BOUND:.0%} of its quota are named, since idle CPU then weighs in."
)
ENCODING_METHOD = (
    "Encoding alone: the serialization benchmark's encode time (orjson from the pool's dicts, protobuf "
    "from prebuilt messages, one thread) fitted the same way over its counts; its b beside each "
    "server's says how much of a per-record difference is the format and how much the server."
)
DECODING_METHOD = (
    "Decoding alone, for uploads: the serialization benchmark's decode time (orjson.loads of the JSON "
    "body into dicts, protobuf parsing the request's bytes, one thread) fitted the same way over its "
    "counts; its b beside each server's says how much of a per-record difference is the format and how "
    "much the server."
)


@dataclass(frozen=True)
class Estimate:
    """A value with its CONFIDENCE interval; low and high are None without one (a fit without residual
    degrees of freedom, two points the line goes through; a mean or a ratio of one round)."""

    value: float
    low: float | None
    high: float | None

    def text(self, spec: str = "{:.2f}", unit: str = "") -> str:
        """'value unit [low, high]', each in spec ("{:,.0f}"); the value alone without an interval."""
        shown = spec.format(self.value) + unit
        if self.low is None or self.high is None:
            return shown
        return f"{shown} [{spec.format(self.low)}, {spec.format(self.high)}]"

    @property
    def relative_half_width(self) -> float | None:
        """How far the interval reaches from the value on its wider side, as a share of the value (a
        fit's is symmetric); None without an interval, or at zero."""
        if self.low is None or self.high is None or self.value == 0:
            return None
        return max(self.high - self.value, self.value - self.low) / abs(self.value)


def scaled(e: Estimate, factor: float) -> Estimate:
    """The estimate in another unit (ms to µs: 1000)."""
    return Estimate(
        e.value * factor,
        None if e.low is None else e.low * factor,
        None if e.high is None else e.high * factor,
    )


@dataclass(frozen=True)
class Covariance:
    """The sampling covariance of a line's two coefficients."""

    fixed: float  # variance of a
    per_record: float  # variance of b
    both: float  # covariance of a and b


@dataclass(frozen=True)
class Line:
    """cost = fixed + per_record · records, in ms, from weighted least squares."""

    fixed: Estimate
    per_record: Estimate
    covariance: Covariance | None  # None with no residual degrees of freedom
    df: int  # residual degrees of freedom: points - 2

    def at(self, records: float) -> float:
        return self.fixed.value + self.per_record.value * records


@dataclass(frozen=True)
class HeldOut:
    """The line fitted without one count, predicting the mean of that count's repeats."""

    count: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative prediction error: predicted / measured - 1."""
        return self.predicted / self.measured - 1


@dataclass(frozen=True)
class Idle:
    """A count whose service used less than SERVICE_CPU_BOUND of its quota (mean over its repeats)."""

    count: int
    utilisation: float


@dataclass(frozen=True)
class CostModel:
    """One target's CPU per request against records, over the counts it ran."""

    target: str
    protocol: str
    points: tuple[tuple[int, float], ...]  # (records, ms per request) of every repeat
    line: Line
    held_out: HeldOut | None  # None with fewer than three counts
    idle: tuple[Idle, ...]
    missing: tuple[int, ...]  # counts the target ran without a CPU per request to fit

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(sorted({records for records, _ in self.points}))


# A line whose fit without a target's largest count misses that count by more than this does not
# describe the target's cost: the margin the lab calls "the same" (stats.EQUIVALENCE_MARGIN), so a miss
# beyond it is a cost the line does not have (it bends), and no crossover of such lines is claimed.
LINEAR_FIT_MISS = EQUIVALENCE_MARGIN


def misfit(model: CostModel) -> str:
    """Why the linear model does not fit a target (its held-out miss beyond LINEAR_FIT_MISS), or ""."""
    h = model.held_out
    if h is None or abs(h.error) <= LINEAR_FIT_MISS:
        return ""
    return (
        f"the linear model does not fit {model.target} (its fit without {h.count:,} records misses "
        f"them by {h.error:+.1%}, beyond ±{LINEAR_FIT_MISS:.0%})"
    )


def bend(model: CostModel) -> str:
    """A target's misfit (misfit()) in a few words: "quart-h1's own line misses 1,000 records by
    -18.8%", or ""."""
    h = model.held_out
    if not misfit(model) or h is None:
        return ""
    return f"{model.target}'s own line misses {h.count:,} records by {h.error:+.1%}"


# Why a crossover comes from two counts alone, or from none: the whole sweep's lines miss (misfit()),
# or the ratio of two lines misses the blocks' ratios (ratio_misfit()).
_NO_LINE = "one line over every count misses its held-out count"
_NO_RATIO = "the ratio of two lines does not fit the blocks' ratios"


@dataclass(frozen=True)
class Crossover:
    """Where gRPC's line meets a REST server's: n* = (a gRPC - a REST) / (b REST - b gRPC)."""

    records: float | None  # None when the per-record costs are exactly equal
    interval: tuple[float, float] | None  # Fieller's, when bounded and the fits have residuals
    unbounded: bool  # Fieller's set is unbounded: the per-record costs are not told apart
    grpc_cheaper_above: bool  # gRPC's per-record cost is the lower: it wins above n*
    span: tuple[int, int]  # the fewest and most records the fits saw
    misfit: str = ""  # why a side's line does not fit its costs (misfit()): the lines are not used
    # With a misfit: the two adjacent counts between which gRPC's mean cost and REST's change order,
    # whose local lines gave records and interval; None when they keep one order (see throughout).
    segment: tuple[int, int] | None = None
    throughout: str = ""  # with a misfit and no segment: "more" or "less", gRPC at every shared count
    # The ratio of the two costs fitted to the blocks' paired ratios (paired_crossover), when it gave
    # records and interval; None when they come from the two lines fitted apart.
    paired: "RatioModel | None" = None
    # With a misfit: which model over every count missed (_NO_LINE or _NO_RATIO), in words.
    no_line: str = _NO_LINE
    # With paired: the lines' own misfits (bend()), for which the ratio model was fitted at the counts
    # below the one they missed (_below_the_bend): "" when both lines pass their check.
    bends: str = ""

    @property
    def resolved(self) -> float | None:
        """n* when the lines fit (or a segment's do), cross at a positive count and the interval is not
        unbounded, else None."""
        if self.records is None or self.records <= 0 or self.unbounded:
            return None
        return None if self.misfit and self.segment is None else self.records

    @property
    def reason(self) -> str:
        """Why there is no crossover at a positive count, or "" when there is one."""
        if self.records is None:
            return "the lines are parallel (equal cost per record)"
        if self.records <= 0:
            side = "less" if self.grpc_cheaper_above else "more"
            return f"gRPC costs {side} per record and per request"
        return ""


@dataclass(frozen=True)
class PerRecordSplit:
    """gRPC - REST per record, for the servers and for the format alone (ms per record): encoding for
    a download, decoding for an upload (format_lines)."""

    servers: Estimate
    encoding: float  # the format alone: the serialization benchmark's operation of the direction

    @property
    def format_share(self) -> float | None:
        """The part of the servers' difference the encoding accounts for; None when the servers'
        difference is not told apart from 0 (or has no interval)."""
        low, high = self.servers.low, self.servers.high
        if low is None or high is None or low <= 0 <= high:
            return None
        return self.encoding / self.servers.value


def fit_line(records: Sequence[float], costs: Sequence[float]) -> Line:
    """costs = a + b·records by weighted least squares, weights 1/m² (m: the mean cost at that count).

    numpy's weights multiply the unweighted residuals, so they are 1/m; the covariance it returns is
    scaled by the weighted residuals over points - 2, the usual estimate when the scale is unknown.
    """
    if len(set(records)) < 2:
        raise ValueError("a line needs two or more counts")
    by_count: dict[float, list[float]] = {}
    for n, cost in zip(records, costs, strict=True):
        by_count.setdefault(n, []).append(cost)
    x = np.asarray(records, dtype=float)
    y = np.asarray(costs, dtype=float)
    weights = np.asarray([1 / statistics.fmean(by_count[n]) for n in records])
    df = len(costs) - 2
    if df == 0:
        slope, intercept = np.polyfit(x, y, 1, w=weights)
        return Line(Estimate(float(intercept), None, None), Estimate(float(slope), None, None), None, 0)
    (slope, intercept), covariance = np.polyfit(x, y, 1, w=weights, cov=True)
    t = t_quantile(CONFIDENCE, df)
    spread = Covariance(
        fixed=float(covariance[1, 1]), per_record=float(covariance[0, 0]), both=float(covariance[0, 1])
    )
    return Line(
        fixed=_estimate(float(intercept), t * math.sqrt(spread.fixed)),
        per_record=_estimate(float(slope), t * math.sqrt(spread.per_record)),
        covariance=spread,
        df=df,
    )


def _estimate(value: float, margin: float) -> Estimate:
    return Estimate(value, value - margin, value + margin)


def fit_target(groups: Sequence[Group], speed: float | None = None) -> CostModel | None:
    """One target's groups fitted (one per count, or in a duet run one per count and partner); None
    when fewer than two counts have a positive CPU per request. Lower bounds are fitted too: CPU per
    request does not need a saturated service.

    speed: the speed reference's CPU per unit the costs are read at (at_speed); None: as measured."""
    points = tuple(
        (g.count, cost)
        for g in groups
        for cost in (at_speed(g, speed) if speed else g.values(CPU))
        if cost > 0
    )
    fitted = {records for records, _ in points}
    if len(fitted) < 2:
        return None
    shares_by_count: dict[int, list[float]] = {}
    for g in groups:
        shares_by_count.setdefault(g.count, []).extend(g.values(UTILISATION))
    idle = [
        Idle(count, mean)
        for count, shares in sorted(shares_by_count.items())
        if shares and (mean := statistics.fmean(shares)) < SERVICE_CPU_BOUND
    ]
    return CostModel(
        target=groups[0].target,
        protocol=groups[0].protocol,
        points=points,
        line=fit_line(*_columns(points)),
        held_out=held_out(points),
        idle=tuple(idle),
        missing=tuple(sorted({g.count for g in groups} - fitted)),
    )


def at_speed(group: Group, speed: float) -> list[float]:
    """Each repeat's CPU per request at the speed reference's `speed` (CPU seconds per unit): times
    speed over the reference's own CPU per unit in that repeat's window (run.speed_reference), so that
    the host's drift between blocks, which slows the reference with the server, leaves the cost."""
    read_cost, read_unit = METRICS[CPU].read, METRICS[REFERENCE].read
    found = ((read_cost(r), read_unit(r)) for r in group.results)
    return [cost * speed / unit for cost, unit in found if cost is not None and unit]


def speed_sentence(speed: float) -> str:
    """How the costs of a run with the speed reference were read (at_speed)."""
    return (
        "Costs are read at one host speed: each repeat's CPU per request times the run's median speed "
        f"reference ({speed * 1e6:.0f} µs of CPU per calibration unit, looped beside the services) over "
        "the reference's own in that repeat's window, so the host's drift between blocks, which slows "
        "the reference with the servers, leaves a and b (docs/measurement.md, speed reference); the "
        "rounds' paired ratios need no such step."
    )


def reference_speed(groups: Iterable[Group]) -> float | None:
    """The median speed reference over every repeat of `groups`: the one speed their costs are read at;
    None unless every repeat with a cost has the reference beside it (a run without one, a resumed run
    whose older windows had none), since costs at two scales would not fit one line."""
    read_cost, read_unit = METRICS[CPU].read, METRICS[REFERENCE].read
    units = [read_unit(r) for g in groups for r in g.results if read_cost(r) is not None]
    beside = [unit for unit in units if unit is not None and unit > 0]
    return statistics.median(beside) if beside and len(beside) == len(units) else None


def held_out(points: Sequence[tuple[int, float]]) -> HeldOut | None:
    """The fit without the largest count predicting it: extrapolating beyond the counts it saw is where
    a cost that is not affine in records (allocation, cache, garbage collection) shows most. None
    below three counts."""
    largest = max(records for records, _ in points)
    rest = [p for p in points if p[0] != largest]
    if len({records for records, _ in rest}) < 2:
        return None
    measured = statistics.fmean(cost for records, cost in points if records == largest)
    return HeldOut(largest, measured, fit_line(*_columns(rest)).at(largest))


def _columns(points: Sequence[tuple[int, float]]) -> tuple[list[int], list[float]]:
    return [records for records, _ in points], [cost for _, cost in points]


def crossover(grpc: CostModel, rest: CostModel, paired: Sequence[tuple[int, float]] = ()) -> Crossover:
    """Where the two costs cross. From the rounds' paired ratios (records, gRPC / REST CPU per request of
    one round) where they give the ratio model enough degrees of freedom (paired_crossover) and it fits
    them (ratio_misfit): they are free of the host's drift between blocks, which the lines fitted apart
    carry. Where a line misses its held-out check (misfit()), the ratio model is fitted at the counts
    below the one it missed, so that the bend does not enter it, and used when its interval lies among
    them (_below_the_bend). Without such ratios, where the two lines meet, with Fieller's interval when
    both fits have residuals. Where the ratio model, or without it a line, does not fit, the lines are
    not extrapolated across the counts: the crossover is sought between the two adjacent counts where
    the targets' mean costs change order, from each target's line through those two counts' repeats
    alone (its interval no wider than the counts where the paired ratios tell which side of it they
    are: _held_by_ratios); with no change of order, gRPC costs more (or less) at every count measured."""
    counts = (*grpc.counts, *rest.counts)
    span = (min(counts), max(counts))
    misfits = "; ".join(m for m in (misfit(grpc), misfit(rest)) if m)
    fitted = paired_crossover(paired, span) if not misfits else _below_the_bend(paired, sorted(set(counts)))
    ratio = fitted.paired if fitted is not None else None
    if fitted is not None and ratio is not None and not ratio_misfit(ratio):
        return replace(fitted, bends="; ".join(b for b in (bend(grpc), bend(rest)) if b))
    if misfits:
        why, no_line = misfits, _NO_LINE
    elif ratio is not None:
        why, no_line = ratio_misfit(ratio), _NO_RATIO
    else:
        return _lines_crossover(grpc.line, rest.line, span)
    shared = sorted(set(grpc.counts) & set(rest.counts))
    order = [_mean(grpc, n) - _mean(rest, n) for n in shared]
    for (low, high), (before, after) in zip(
        itertools.pairwise(shared), itertools.pairwise(order), strict=True
    ):
        if before * after < 0:
            local = _lines_crossover(_segment(grpc, low, high), _segment(rest, low, high), span)
            if local.records is not None and low <= local.records <= high:
                local = _held_by_ratios(local, paired, shared)
            return replace(local, misfit=why, segment=(low, high), no_line=no_line)
    throughout = "more" if all(d > 0 for d in order) else "less" if all(d < 0 for d in order) else ""
    lines = _lines_crossover(grpc.line, rest.line, span)
    return replace(lines, misfit=why, throughout=throughout, no_line=no_line)


def _below_the_bend(paired: Sequence[tuple[int, float]], counts: Sequence[int]) -> Crossover | None:
    """The ratio model's crossover from the rounds' ratios at the counts below the largest, the counts
    whose lines the held-out check fitted, so that a cost bending at the largest count does not enter
    it; None without one whose interval lies among those counts (beyond them is the bend's reach), or
    with too few counts or rounds there (paired_crossover)."""
    if len(counts) < 4:
        return None
    below = counts[:-1]
    c = paired_crossover([r for r in paired if r[0] in below], (below[0], below[-1]))
    if c is None or c.interval is None or not below[0] <= c.interval[0] <= c.interval[1] <= below[-1]:
        return None
    return c


def _held_by_ratios(c: Crossover, paired: Sequence[tuple[int, float]], counts: Sequence[int]) -> Crossover:
    """c's interval no wider than the counts where the rounds' paired ratios put gRPC on either side of
    REST, each ratio's interval clear of 1 (_side): the costs cross above the last count at or below c
    whose ratio is on the side of the fewest records, and below the first at or above it on the other
    (a ratio of two lines is monotone in the records). Two lines fitted apart carry the host's drift,
    which the ratios do not: `payload18` placed gRPC/Quart "at 160 records [-51, 310]" from the lines
    through 100 and 1,000 records while its ratios at 10 records were 0.77-0.79. An interval without
    ends (unbounded) becomes the two counts where both sides are told, else stays."""
    assert c.records is not None
    fewest = not c.grpc_cheaper_above  # gRPC's side (cheaper or not) at the fewest records
    sides = {n: side for n in counts if (side := _side(paired, n)) is not None}
    low = max((n for n, cheaper in sides.items() if cheaper == fewest and n <= c.records), default=0)
    high = min((n for n, cheaper in sides.items() if cheaper != fewest and n >= c.records), default=math.inf)
    if c.interval is None:
        return c if low == 0 or high == math.inf else replace(c, interval=(low, high), unbounded=False)
    return replace(c, interval=(max(c.interval[0], low), min(c.interval[1], high)))


def _side(paired: Sequence[tuple[int, float]], count: int) -> bool | None:
    """Whether the rounds' paired ratios at count put gRPC below REST (True) or above (False), their
    interval clear of 1 (significant); None with fewer than two rounds there or an interval holding 1."""
    ratios = [r for n, r in paired if n == count]
    if len(ratios) < 2:
        return None
    at = paired_ratio(ratios, [1.0] * len(ratios))
    return at.estimate < 1 if at.significant else None


def _mean(model: CostModel, count: int) -> float:
    return statistics.fmean(cost for records, cost in model.points if records == count)


def _segment(model: CostModel, low: int, high: int) -> Line:
    """The target's line through its repeats at two counts alone."""
    return fit_line(*_columns([p for p in model.points if p[0] in (low, high)]))


def _lines_crossover(g: Line, r: Line, span: tuple[int, int]) -> Crossover:
    """Where gRPC's line g meets REST's line r, with Fieller's interval when both have residuals (from
    0 records where it reaches below: `payload18` printed "crosses at 160 records [-51, 310]")."""
    numerator = g.fixed.value - r.fixed.value
    denominator = r.per_record.value - g.per_record.value
    interval, unbounded = None, False
    if g.covariance is not None and r.covariance is not None:
        interval = fieller(
            numerator,
            denominator,
            var_numerator=g.covariance.fixed + r.covariance.fixed,
            var_denominator=g.covariance.per_record + r.covariance.per_record,
            # a gRPC - a REST against b REST - b gRPC: each fit's own covariance, sign flipped.
            covariance=-(g.covariance.both + r.covariance.both),
            t=t_quantile(CONFIDENCE, min(g.df, r.df)),
        )
        unbounded = interval is None
    records = numerator / denominator if denominator else None
    if interval is not None and records is not None and records > 0:
        # A call carries no fewer than 0 records: Fieller's set below 0 holds no crossover.
        interval = (max(interval[0], 0.0), interval[1])
    return Crossover(
        records=records,
        interval=interval,
        unbounded=unbounded,
        grpc_cheaper_above=denominator > 0,
        span=span,
    )


@dataclass(frozen=True)
class RatioModel:
    """gRPC / REST CPU per request as the ratio of two lines, (fixed + per_record·n) / (1 +
    rest_per_record·n): each line's a and b over REST's a, which is all a ratio can tell of them. Fitted
    to the paired ratios of the blocks (or rounds) at every count."""

    fixed: float  # a gRPC / a REST
    per_record: float  # b gRPC / a REST
    rest_per_record: float  # b REST / a REST
    residual: float  # the standard deviation of a round's log ratio about the model
    df: int  # rounds - 3
    # The lack-of-fit F test's p: the counts' mean ratios about the model against the rounds about their
    # count's mean; None without degrees of freedom for either (three counts, or one round each).
    lack_of_fit: float | None
    # The count where one more block narrows the crossover's interval most (_sharpest_count); None
    # without a crossover at a positive count.
    sharpest: int | None = None

    def at(self, records: float) -> float:
        return (self.fixed + self.per_record * records) / (1 + self.rest_per_record * records)


# How far below the fewest and above the most records measured the crossover's interval is sought;
# a set reaching either end is unbounded.
_REACH = 100.0
_GRID = 80  # points of the coarse search for the interval's ends, spaced evenly in log records


def paired_crossover(ratios: Sequence[tuple[int, float]], span: tuple[int, int]) -> Crossover | None:
    """Where gRPC's and REST's costs cross, from the rounds' paired ratios (records, gRPC / REST CPU per
    request of one round): least squares on their logarithms with the ratio model (RatioModel), and the
    interval of every crossover the ratios do not reject, (RSS(n*) - RSS) / s² <= F(1, df) with the
    model refitted through n* (the profile likelihood's; like Fieller's, unbounded when the per-record
    costs are not told apart). A host's slow block slows both sides of its ratio, so it cancels here as
    in every ratio of a run, where the lines fitted apart carry it. None with fewer than three counts
    or PAIRED_MIN_DF degrees of freedom."""
    counts = sorted({n for n, _ in ratios})
    df = len(ratios) - 3
    if len(counts) < 3 or df < PAIRED_MIN_DF or min(r for _, r in ratios) <= 0:
        return None
    records = np.asarray([n for n, _ in ratios], dtype=float)
    logs = np.log([r for _, r in ratios])

    def residuals(log_params: np.ndarray) -> np.ndarray:
        alpha, beta, gamma = np.exp(log_params)
        return _log_ratio(alpha, beta, gamma, records) - logs

    fit = min(
        (optimize.least_squares(residuals, start) for start in _starts(records, logs)),
        key=lambda r: float(np.sum(r.fun**2)),
    )
    alpha, beta, gamma = (float(v) for v in np.exp(fit.x))
    rss = float(np.sum(fit.fun**2))
    crossing = (alpha - 1) / (gamma - beta) if gamma != beta else None
    sharpest = _sharpest_count(fit, records) if crossing is not None and crossing > 0 else None
    model = RatioModel(
        alpha, beta, gamma, math.sqrt(rss / df), df, _lack_of_fit(records, logs, rss), sharpest
    )
    limit = rss + rss / df * t_quantile(CONFIDENCE, df) ** 2

    def profile(at: float) -> float:
        """The least RSS of a ratio model that crosses 1 at `at` records, less the limit (<= 0: inside)."""

        def through(log_params: np.ndarray) -> np.ndarray:
            beta, gamma = np.exp(log_params)
            alpha = 1 + (gamma - beta) * at
            if alpha <= 0:  # no model with positive costs crosses there with these slopes
                return np.full(len(logs), 1e3)
            return _log_ratio(alpha, beta, gamma, records) - logs

        starts = [fit.x[1:], fit.x[1:] + np.array([0.0, 1.0]), fit.x[1:] + np.array([1.0, 0.0])]
        return min(float(np.sum(optimize.least_squares(through, s0).fun ** 2)) for s0 in starts) - limit

    interval, unbounded = None, False
    if crossing is not None and crossing > 0:
        interval = _profile_interval(profile, crossing, span)
        unbounded = interval is None
    return Crossover(
        records=crossing,
        interval=interval,
        unbounded=unbounded,
        grpc_cheaper_above=beta < gamma,
        span=span,
        paired=model,
    )


def _sharpest_count(fit: optimize.OptimizeResult, records: np.ndarray) -> int:
    """The count where one more block, agreeing with the fitted model, narrows the crossover's interval
    most (the c-optimal next block of a sequential design): the largest drop of ln n*'s delta-method
    variance s² gᵀ(JᵀJ)⁻¹g, g its gradient in the model's log parameters and J the blocks' rows of the
    fit's Jacobian, that the count's row j adds to JᵀJ: (gᵀA⁻¹j)² / (1 + jᵀA⁻¹j) with A = JᵀJ
    (Sherman-Morrison). A count where the ratio is near 1 places n* almost by itself; another tells it
    through the slope, and may be the one to measure where the slope is what is unknown (a crossing
    at 502 records of 1-1,000 sends the block to 1,000: test_payload_model)."""
    alpha, beta, gamma = np.exp(fit.x)
    # ln n* = ln(alpha - 1) - ln(gamma - beta), differentiated in ln alpha, ln beta and ln gamma.
    gradient = np.array([alpha / (alpha - 1), beta / (gamma - beta), -gamma / (gamma - beta)])
    inverse = np.linalg.pinv(fit.jac.T @ fit.jac)

    def drop(count: float) -> float:
        row = fit.jac[np.flatnonzero(records == count)[0]]
        return float((gradient @ inverse @ row) ** 2 / (1 + row @ inverse @ row))

    return int(max(np.unique(records), key=drop))


# A sum of squared log ratios this small is rounding: rounds that agree to about 1e-9 have no spread to
# test a lack of fit against.
_EXACT = 1e-18


def _lack_of_fit(records: np.ndarray, logs: np.ndarray, rss: float) -> float | None:
    """The p of the F test of the ratio model's lack of fit (its RSS less the pure error, on counts - 3
    degrees of freedom) against the pure error (the rounds about their count's mean)."""
    counts = np.unique(records)
    pure = float(sum(np.sum((logs[records == c] - logs[records == c].mean()) ** 2) for c in counts))
    lack_df, pure_df = len(counts) - 3, len(logs) - len(counts)
    if lack_df < 1 or pure_df < 1 or pure <= _EXACT:
        return None
    return float(stats.f.sf(max(rss - pure, 0.0) / lack_df / (pure / pure_df), lack_df, pure_df))


def ratio_misfit(model: RatioModel) -> str:
    """Why the ratio of two lines does not describe the blocks' ratios (its lack of fit significant at
    LACK_OF_FIT), or ""."""
    if model.lack_of_fit is None or model.lack_of_fit >= LACK_OF_FIT:
        return ""
    return f"{_NO_RATIO} (lack of fit p = {model.lack_of_fit:.3f})"


def _log_ratio(fixed: float, per_record: float, rest_per_record: float, records: np.ndarray) -> np.ndarray:
    """The ratio model's logarithm at records (RatioModel.at)."""
    return np.asarray(np.log(fixed + per_record * records) - np.log1p(rest_per_record * records))


def _starts(records: np.ndarray, logs: np.ndarray) -> list[np.ndarray]:
    """Starting points (the logarithms of RatioModel's fixed, per_record and rest_per_record): fixed from
    the fewest records' ratio, the most records' ratio met at several REST costs per record."""
    low, high = records.min(), records.max()
    first = float(np.exp(logs[records == low].mean()))
    last = float(np.exp(logs[records == high].mean()))
    starts = []
    for gamma in (1 / high, 10 / high, 100 / high, 1 / low):
        beta = max(last * (1 + gamma * high) - first, 1e-9) / high
        starts.append(np.log([first, beta, gamma]))
    return starts


def _profile_interval(
    profile: Callable[[float], float], crossing: float, span: tuple[int, int]
) -> tuple[float, float] | None:
    """The ends of {n: profile(n) <= 0} around crossing, each found between the coarse grid's last point
    inside and first outside; None when the set reaches _REACH beyond the span either way."""
    low, high = span[0] / _REACH, span[1] * _REACH
    grid = np.geomspace(low, high, _GRID)
    below = [n for n in grid if n < crossing][::-1]
    above = [n for n in grid if n > crossing]
    ends = []
    for side in (below, above):
        inside = crossing
        for n in side:
            if profile(float(n)) > 0:
                ends.append(optimize.brentq(profile, min(inside, n), max(inside, n), xtol=1e-3 * n))
                break
            inside = float(n)
        else:
            return None
    return (min(ends), max(ends))


# Relative rounding below which Fieller's leading coefficient counts as zero.
ROUNDING = 1e-9


def fieller(
    numerator: float,
    denominator: float,
    *,
    var_numerator: float,
    var_denominator: float,
    covariance: float,
    t: float,
) -> tuple[float, float] | None:
    """Fieller's interval for numerator / denominator; None when it is unbounded.

    The set of θ with (N - θD)² <= t² (v_NN - 2θ v_ND + θ² v_DD) is a finite interval when the
    denominator differs from 0 at this level (D² > t² v_DD); otherwise it is the whole line or its
    complement around an interval, unbounded either way. A denominator that differs from 0 by a hair
    (D² - t² v_DD within rounding of D²) counts as not differing: the ends, divided by that hair,
    would be lost to cancellation.
    """
    a = denominator**2 - t**2 * var_denominator
    if a <= ROUNDING * denominator**2:
        return None
    b = numerator * denominator - t**2 * covariance
    c = numerator**2 - t**2 * var_numerator
    # b² - ac >= 0 whenever a > 0: the estimate N / D itself lies in the set.
    root = math.sqrt(max(b**2 - a * c, 0.0))
    return ((b - root) / a, (b + root) / a)


def encoder(protocol: str) -> str:
    """The codec of the benchmark that encodes a target's responses and decodes its uploads."""
    return "protobuf" if protocol == "grpc" else "orjson"


def operation(direction: str) -> str:
    """What the server does with the format per record: encode a download's response, decode an
    upload's request."""
    return "decode" if direction == UPLOAD else "encode"


def encoding_lines(cases: Sequence[Case], op: str = "encode", shape: str = DEFAULT_SHAPE) -> dict[str, Line]:
    """codec -> its time per body for op ("encode" or "decode") on `shape`'s records as a + b·n in ms, for
    each codec benchmarked at two or more counts (the benchmark's microseconds / 1,000, its geometric
    mean per count)."""
    lines = {}
    for codec in ("orjson", "protobuf"):
        timed = [c for c in cases if c.codec == codec and c.operation == op and c.shape == shape]
        if len({c.count for c in timed}) >= 2:
            lines[codec] = fit_line([c.count for c in timed], [c.geomean_us / 1000 for c in timed])
    return lines


def format_lines(cases: Sequence[Case], direction: str, shape: str = DEFAULT_SHAPE) -> dict[str, Line]:
    """The format-alone lines a sweep in direction compares its servers with: encode for downloads,
    decode for uploads (the server parses the request body before it builds its objects), on the
    sweep's record shape; none for a shape the benchmark did not run."""
    return encoding_lines(cases, operation(direction), shape)


def per_record_difference(grpc: Line, rest: Line) -> Estimate:
    """gRPC's b - REST's b (any two lines' b), with an interval when both fits have residuals (the fits
    independent, the fewer of their degrees of freedom)."""
    difference = grpc.per_record.value - rest.per_record.value
    if grpc.covariance is None or rest.covariance is None:
        return Estimate(difference, None, None)
    variance = grpc.covariance.per_record + rest.covariance.per_record
    return _estimate(difference, t_quantile(CONFIDENCE, min(grpc.df, rest.df)) * math.sqrt(variance))


def per_record_split(grpc: Line, rest: Line, encodings: Mapping[str, Line]) -> PerRecordSplit | None:
    """gRPC - REST per record for the servers and for the format alone (encodings: format_lines of the
    sweep's direction); None without both codecs benchmarked."""
    if "protobuf" not in encodings or "orjson" not in encodings:
        return None
    encoding = encodings["protobuf"].per_record.value - encodings["orjson"].per_record.value
    return PerRecordSplit(per_record_difference(grpc, rest), encoding)


def crossover_text(c: Crossover) -> str:
    """E.g. "crosses at 40 records [31, 52], gRPC cheaper above", or why it does not."""
    if c.misfit and c.segment is None and c.throughout:
        first, last = c.span
        every = f"gRPC costs {c.throughout} at every count"
        return f"no crossover from {first:,} to {last:,} records, {every} ({c.no_line})"
    if c.records is None:
        return f"no crossover, {c.reason}"
    meet = f"{records(c.records)} records{_interval(c)}"
    if c.misfit and c.segment is None:
        return f"no crossover claimed, {c.misfit} (lines meet at {meet})"
    text = _lines_text(c, meet)
    if c.bends:
        return f"{text} (from the blocks' ratios at {c.span[0]:,} to {c.span[1]:,} records: {c.bends})"
    if c.segment is None:
        return text
    alone = f"from the lines through {c.segment[0]:,} and {c.segment[1]:,} records alone"
    return f"{text} ({alone}: {c.no_line})"


def _lines_text(c: Crossover, meet: str) -> str:
    """The crossover of two lines (the whole sweep's, or a segment's) in words."""
    assert c.records is not None
    if c.unbounded:
        unbounded = "interval unbounded; lines meet at"
        return f"no crossover resolved, per-record costs not told apart ({unbounded} {meet})"
    if c.reason:
        return f"no crossover, {c.reason} (lines meet at {meet})"
    text = f"crosses at {meet}, gRPC cheaper {'above' if c.grpc_cheaper_above else 'below'}"
    if c.records > c.span[1]:
        return text + f" (extrapolated beyond {c.span[1]:,})"
    if c.records < c.span[0]:
        return text + f" (extrapolated below {c.span[0]:,})"
    return text


def _interval(c: Crossover) -> str:
    if c.interval is not None:
        return f" [{records(c.interval[0])}, {records(c.interval[1])}]"
    # The paired ratios' interval is sought at positive counts only: none for a crossing at or below 0.
    return "" if c.unbounded or c.paired is not None else " (no interval: a line through two points)"


def records(value: float) -> str:
    """A number of records: one decimal below 10, whole numbers with thousands separators above."""
    return f"{value:.1f}" if abs(value) < 10 else f"{value:,.0f}"


def held_out_sentence(models: Sequence[CostModel]) -> str:
    """E.g. "cost model check: each target's fit without its largest count predicts it within 4.2%
    (8 targets; largest error aiohttp-h1-tls -4.2% at 1,000 records)"."""
    checked = [(m.target, m.held_out) for m in models if m.held_out is not None]
    if not checked:
        return "cost model not checked: a held-out count needs three or more counts"
    target, worst = max(checked, key=lambda pair: abs(pair[1].error))
    sentence = (
        f"cost model check: each target's fit without its largest count predicts it within "
        f"{abs(worst.error):.1%} ({len(checked)} targets; largest error {target} {worst.error:+.1%} "
        f"at {worst.count:,} records)"
    )
    unchecked = len(models) - len(checked)
    return sentence + (f"; {unchecked} with too few counts to check" if unchecked else "")
