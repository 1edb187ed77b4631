"""Statistics over repeats: geometric means with log-scale t intervals, and ratio tests."""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

# The t distribution's functions alone: scipy.stats, whose t-tests this module used to call, took about
# 1 s to import (its distributions' docstrings) in every run's process; the tests compare these
# t-tests with scipy.stats' own (tests/unit/test_stats.py).
from scipy import special

from labrunner.results.trust import MAX_INTERVAL_WIDTH, SETTLED_HALF_WIDTH, rounds_needed, too_wide

CONFIDENCE = 0.95  # intervals in tables and charts, and the level of every significance test
# "Equivalent" means within ±10% by two one-sided tests (TOST) at the same level: the ratio's
# 1 - 2 x (1 - CONFIDENCE) interval (90%) lies inside [0.9, 1.1]. Without that, a ratio that is
# not significant is inconclusive, never "the same".
EQUIVALENCE_MARGIN = 0.10
ONE_REPEAT = "n/a: one repeat"
NOT_POSITIVE = "n/a: values not positive"
CENTRE = "geometric mean"  # the centre of a group of repeats, wherever one is shown
METHOD_LINE = (
    f"Each group's centre is the {CENTRE} of its repeats, with the {CONFIDENCE:.0%} Student t interval "
    "of the mean of the logarithms, exp(mean(ln x) ± t·sd(ln x)/√n): it never reaches zero."
)
RATIO_METHOD_LINE = (
    "A ratio within a run pairs its groups' repeats round by round: its centre is the "
    f"geometric mean of the per-round ratios, its {CONFIDENCE:.0%} interval the Student t interval of "
    "their logarithms, so a round the host slowed for both sides cancels. A table calls a ratio "
    "significant when that interval excludes 1, one test alone; the findings correct over the run's "
    "tests of each metric (Holm). In a duet the rounds are blocks, both sides measured at once, and "
    "the spread of a pair's req/s and CPU per request ratios from block to block is moderated by the "
    "run's other duet pairs (limma's moderated t: an empirical Bayes prior on the variances, whose "
    "degrees of freedom the t borrows; not the A/A control's). "
    "Where repeats have no partner (a run against another), Welch's t-test on the logarithms. An "
    f"interval wider than {MAX_INTERVAL_WIDTH:g}x (high / low) is shown as — with about how many "
    "rounds it needs."
)


@dataclass(frozen=True)
class Summary:
    """A sample of repeats: its geometric mean and a CONFIDENCE interval on the log scale.

    Requests/s, latency, CPU and bytes are positive and their spread grows with their level,
    so the centre and the interval are taken on the logarithms and brought back: the interval
    is asymmetric and stays above zero, and ratios of these centres are what ratio() tests.
    With one value, or a value not positive, there is no interval (note says why); with a value
    not positive the centre is the arithmetic mean.
    """

    n: int
    centre: float  # the geometric mean (arithmetic with a value not positive, see note)
    low: float | None
    high: float | None
    minimum: float
    maximum: float
    note: str = ""


@dataclass(frozen=True)
class Ratio:
    """candidate / baseline with its CONFIDENCE interval and whether it differs from 1.

    significant is None when it cannot be decided (note says why); the estimate is
    then still the ratio of the geometric means (of the arithmetic ones when a value is not positive).
    """

    estimate: float
    low: float | None
    high: float | None
    p_value: float | None
    significant: bool | None
    note: str = ""
    equivalent: bool | None = None  # within ±EQUIVALENCE_MARGIN by TOST; None when not testable
    rounds: int | None = None  # the rounds paired (Welch's test: the fewer repeats of a side)
    # The degrees of freedom its spread borrowed from the run's other duet pairs (SpreadPrior): its t
    # has rounds - 1 + prior_df of them. 0 for a ratio judged on its own rounds alone.
    prior_df: float = 0.0


def relative_half_width(r: Ratio) -> float | None:
    """How far a ratio's interval reaches from its estimate, as a share of it, on its wider side:
    [0.95, 1.05] around 1.00 is 0.05. None without an interval."""
    if r.low is None or r.high is None:
        return None
    return max(r.high / r.estimate, r.estimate / r.low) - 1


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student t critical value: P(|T| <= value) = confidence with df degrees of freedom."""
    return float(special.stdtrit(df, (1 + confidence) / 2))


def half_width(stddev: float, n: int, confidence: float) -> float:
    """Half of the Student t interval of a mean from n values with sample standard deviation stddev."""
    return t_quantile(confidence, n - 1) * stddev / math.sqrt(n)


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(ln x)); the arithmetic mean when a value is not positive."""
    if len(set(values)) == 1:
        return values[0]  # exactly, where exp(ln x) could be off in the last bit
    if min(values) <= 0:
        return statistics.fmean(values)
    return math.exp(statistics.fmean([math.log(v) for v in values]))


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """The geometric mean and the log-scale t interval of values."""
    if not values:
        raise ValueError("summarize needs at least one value")
    n, low, high = len(values), min(values), max(values)
    centre = geometric_mean(values)
    if low <= 0:
        return Summary(n, centre, None, None, low, high, NOT_POSITIVE)
    if n == 1:
        return Summary(n, centre, None, None, low, high, ONE_REPEAT)
    logs = [math.log(v) for v in values]
    margin = half_width(statistics.stdev(logs), n, confidence)
    # Clamped to the centre: exp rounds a zero-width interval a hair away from it.
    return Summary(
        n,
        centre,
        min(centre, math.exp(statistics.fmean(logs) - margin)),
        max(centre, math.exp(statistics.fmean(logs) + margin)),
        low,
        high,
    )


def ratio(candidate: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """How candidate compares with baseline: a Welch t-test on the logarithms of the repeats.

    Why this test: requests/s, latencies and CPU per request are positive and their
    spread grows with their level, so they are compared on a log scale, where a
    difference of means is a ratio (of geometric means) and the spread of a fast and a
    slow target becomes comparable. Welch's test does not assume equal variances, which
    two servers rarely have. With 2-5 repeats a bootstrap has too few distinct resamples
    to give an interval; the t interval is exact for log-normal repeats and widens
    honestly with few of them. The interval is exp(mean difference +- t * standard
    error) with Welch-Satterthwaite degrees of freedom (as scipy.stats' Welch test and its
    confidence_interval have it), so "significant" (p below 1 - confidence) and "the interval
    excludes 1" always agree.
    """
    if not candidate or not baseline:
        raise ValueError("ratio needs values on both sides")
    estimate = geometric_mean(candidate) / geometric_mean(baseline)
    if min(*candidate, *baseline) <= 0:
        return Ratio(estimate, None, None, None, None, NOT_POSITIVE)
    if len(candidate) < 2 or len(baseline) < 2:
        return Ratio(estimate, None, None, None, None, ONE_REPEAT)
    log_c = [math.log(v) for v in candidate]
    log_b = [math.log(v) for v in baseline]
    difference = statistics.fmean(log_c) - statistics.fmean(log_b)
    if len(set(log_c)) == 1 and len(set(log_b)) == 1:
        # No spread on either side (e.g. bytes per response): any difference is real.
        return _exact(math.exp(difference), same=difference == 0)
    # Welch's test: each side's variance of its mean, and the Welch-Satterthwaite degrees of freedom.
    share_c = statistics.variance(log_c) / len(log_c)
    share_b = statistics.variance(log_b) / len(log_b)
    df = (share_c + share_b) ** 2 / (share_c**2 / (len(log_c) - 1) + share_b**2 / (len(log_b) - 1))
    welch = TTest(difference, math.sqrt(share_c + share_b), df)
    return _tested(math.exp(difference), welch, confidence, min(len(log_c), len(log_b)))


@dataclass(frozen=True)
class SpreadPrior:
    """What the duet pairs of a run tell of one another's spread from block to block: limma's
    empirical Bayes prior (Smyth 2004, fitFDist), a scaled inverse chi-square distribution of the
    variances of the pairs' per-block log ratios, with `df` degrees of freedom around `variance`.
    df is infinite when the pairs' variances differ no more than sampling alone would make them."""

    df: float
    variance: float
    pooled_df: float  # every pair's own degrees of freedom summed: no moderated ratio has more

    def moderate(self, variance: float, df: int) -> tuple[float, float]:
        """A pair's own variance from `df` degrees of freedom, moderated: the weighted mean of its own
        and the prior's, (d0·s0² + d·s²) / (d0 + d), and its t's degrees of freedom, d0 + d capped at
        the pooled (limma's squeezeVar and eBayes)."""
        if math.isinf(self.df):
            return self.variance, self.pooled_df
        moderated = (self.df * self.variance + df * variance) / (self.df + df)
        return moderated, min(self.df + df, self.pooled_df)


# Below this many pairs the spread of their variances says too little of the prior's df.
SPREAD_PRIOR_PAIRS = 4


def spread_prior(variances: Sequence[float], dfs: Sequence[int]) -> SpreadPrior | None:
    """limma's fitFDist without covariates: the prior the sample variances `variances` (each with its
    `dfs` degrees of freedom) are drawn from, fitted by the moments of their logarithms. None with
    fewer than SPREAD_PRIOR_PAIRS variances above 0."""
    kept = [(v, d) for v, d in zip(variances, dfs, strict=True) if v > 0 and d > 0]
    if len(kept) < SPREAD_PRIOR_PAIRS:
        return None
    # log s² has mean log σ² + digamma(d/2) - log(d/2) and variance trigamma(d/2) about the prior's.
    centred = [math.log(v) - special.digamma(d / 2) + math.log(d / 2) for v, d in kept]
    mean = statistics.fmean(centred)
    excess = statistics.variance(centred) - statistics.fmean([special.polygamma(1, d / 2) for _, d in kept])
    pooled = float(sum(d for _, d in kept))
    if excess <= 0:
        return SpreadPrior(math.inf, math.exp(mean), pooled)
    df = 2 * _trigamma_inverse(excess)
    return SpreadPrior(df, math.exp(mean + special.digamma(df / 2) - math.log(df / 2)), pooled)


def _trigamma_inverse(value: float) -> float:
    """The y with trigamma(y) = value (> 0): trigamma falls from +inf to 0 over y > 0. A bisection,
    not scipy.optimize's root finders: importing scipy.optimize takes about 0.35 s, in every process
    that renders a report (tests/unit/test_spread_prior.py checks this against brentq)."""
    low, high = 1e-8, 1e8
    while high / low > 1 + 1e-12:  # bisection on the log scale: trigamma is monotone
        middle = math.sqrt(low * high)
        low, high = (middle, high) if special.polygamma(1, middle) > value else (low, middle)
    return math.sqrt(low * high)


def paired_ratio(
    candidate: Sequence[float],
    baseline: Sequence[float],
    confidence: float = CONFIDENCE,
    prior: SpreadPrior | None = None,
) -> Ratio:
    """How candidate compares with baseline when their i-th values were measured together (the same
    round of a run): a paired t-test on the logarithms, so what slowed or sped a whole round (the
    host, the hypervisor) cancels in each round's ratio instead of widening both groups' spread.

    The ratio is exp(mean of the rounds' log ratios), its interval exp(mean ± t·sd/√n) with n - 1
    degrees of freedom (as scipy.stats' ttest_rel), TOST at 1 - 2(1 - confidence) as for ratio().
    With a prior (a run's duet pairs, SpreadPrior), the rounds' variance is moderated by it and the t
    has its degrees of freedom too: limma's moderated t.
    """
    if len(candidate) != len(baseline) or not candidate:
        raise ValueError("paired_ratio needs the same number of values on both sides")
    if min(*candidate, *baseline) <= 0:
        return ratio(candidate, baseline, confidence)
    if len(candidate) < 2:
        return Ratio(candidate[0] / baseline[0], None, None, None, None, ONE_REPEAT)
    differences = [math.log(c) - math.log(b) for c, b in zip(candidate, baseline, strict=True)]
    point = math.exp(statistics.fmean(differences))
    if max(differences) - min(differences) < 1e-12:  # every round the same ratio, to rounding: exact
        return _exact(point, same=abs(differences[0]) < 1e-12)
    n = len(differences)
    variance, df = statistics.variance(differences), float(n - 1)
    if prior is not None:
        variance, df = prior.moderate(variance, n - 1)
    test = TTest(statistics.fmean(differences), math.sqrt(variance / n), df)
    return replace(_tested(point, test, confidence, n), prior_df=df - (n - 1))


def _exact(point: float, same: bool) -> Ratio:
    """A ratio without spread on either side: its interval is the point, and any difference is real."""
    return Ratio(point, point, point, 1.0 if same else 0.0, not same, equivalent=_within_margin(point, point))


@dataclass(frozen=True)
class TTest:
    """A t-test of a mean difference of logarithms against 0 (Welch's or paired): the difference, its
    standard error (above 0) and the degrees of freedom, as scipy.stats' ttest_ind and ttest_rel have them."""

    difference: float
    standard_error: float
    df: float

    @property
    def p_value(self) -> float:
        """Two-sided."""
        return float(2 * special.stdtr(self.df, -abs(self.difference / self.standard_error)))

    def interval(self, confidence: float) -> tuple[float, float]:
        """The difference's Student t interval at this confidence."""
        margin = t_quantile(confidence, self.df) * self.standard_error
        return self.difference - margin, self.difference + margin


def _tested(point: float, test: TTest, confidence: float, rounds: int) -> Ratio:
    """The ratio `point` judged by a t-test on the logarithms (Welch's or paired): its interval,
    significance and TOST at 1 - 2(1 - confidence). The interval is clamped to the point, which exp
    of a zero-width interval's ends can miss by a rounding."""
    low, high = test.interval(confidence)
    tost_low, tost_high = test.interval(1 - 2 * (1 - confidence))
    p_value = test.p_value
    return Ratio(
        estimate=point,
        low=min(point, math.exp(low)),
        high=max(point, math.exp(high)),
        p_value=p_value,
        significant=p_value < 1 - confidence,
        equivalent=_within_margin(math.exp(tost_low), math.exp(tost_high)),
        rounds=rounds,
    )


def too_few_rounds(
    centre: float, low: float | None, high: float | None, rounds: int | None, prior_df: float = 0.0
) -> str | None:
    """Why an interval around `centre` decides nothing, in the words every table and finding prints
    instead of it: 'too few rounds: about N needed for ±5%' when it is wider than
    trust.MAX_INTERVAL_WIDTH (N: trust.rounds_needed; rounds None: an interval over latency batches,
    which more rounds would not narrow); None when it is narrower, or there is none."""
    if low is None or high is None or not too_wide(low, high):
        return None
    if rounds is None:  # an interval over latency batches (report/compare.py), not over rounds
        return "too wide: latency moved from batch to batch in its window (a queue near the quota)"
    if rounds < 2 or low <= 0:
        return "too few rounds"
    log_half_width = max(math.log(high / centre), math.log(centre / low))
    needed = rounds_needed(log_half_width, rounds, prior_df=prior_df)
    return f"too few rounds: about {needed:,} needed for ±{SETTLED_HALF_WIDTH:.0%}"


def ratio_too_wide(r: Ratio) -> str | None:
    """too_few_rounds of a ratio's interval."""
    return too_few_rounds(r.estimate, r.low, r.high, r.rounds, r.prior_df)


def summary_too_wide(s: Summary) -> str | None:
    """too_few_rounds of a group's interval over its repeats."""
    return too_few_rounds(s.centre, s.low, s.high, s.n)


def _within_margin(low: float, high: float) -> bool:
    return low >= 1 - EQUIVALENCE_MARGIN and high <= 1 + EQUIVALENCE_MARGIN


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for testing them all at once: the i-th smallest is
    multiplied by (m - i), then made non-decreasing; an adjusted value below the level keeps the chance
    of any false "significant" across the m tests at that level. (Hand-written: scipy has only
    Benjamini-Hochberg, and six lines do not justify statsmodels.)"""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# A percentile is shown only where at least this many of each repeat's samples lie beyond it: p99
# needs 1,000 samples a repeat, p99.9 10,000. With fewer, the figure is one of the few largest samples.
MIN_SAMPLES_BEYOND = 10


def supports(samples: int, fraction: float) -> bool:
    """Whether `samples` values put at least MIN_SAMPLES_BEYOND beyond the `fraction` percentile."""
    return samples * (1 - fraction) >= MIN_SAMPLES_BEYOND - 1e-9


def samples_needed(fraction: float) -> int:
    """The fewest samples that support the `fraction` percentile."""
    return math.ceil(MIN_SAMPLES_BEYOND / (1 - fraction) - 1e-9)
