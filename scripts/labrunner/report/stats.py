"""Statistics over repeats: BenchmarkDotNet's columns, confidence intervals and ratio tests."""

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

CONFIDENCE = 0.95  # intervals in tables and charts, and the level of every significance test
ERROR_CONFIDENCE = 0.999  # BenchmarkDotNet's Error column: half of the 99.9% interval
ONE_REPEAT = "n/a: one repeat"


@dataclass(frozen=True)
class Summary:
    """A sample of repeats in BenchmarkDotNet's terms plus a CONFIDENCE interval of the mean.

    With one value there is no spread: stddev, error and the interval are None.
    """

    n: int
    mean: float
    median: float
    stddev: float | None
    error: float | None  # half the ERROR_CONFIDENCE interval of the mean (Student t)
    ci_low: float | None  # CONFIDENCE interval of the mean (Student t)
    ci_high: float | None
    minimum: float
    maximum: float


@dataclass(frozen=True)
class Ratio:
    """candidate / baseline with its CONFIDENCE interval and whether it differs from 1.

    significant is None when it cannot be decided (note says why); the estimate is
    then still the plain ratio of the means.
    """

    estimate: float
    low: float | None
    high: float | None
    p_value: float | None
    significant: bool | None
    note: str = ""


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student t critical value: P(|T| <= value) = confidence with df degrees of freedom."""
    return float(scipy_stats.t.ppf((1 + confidence) / 2, df))


def half_width(stddev: float, n: int, confidence: float) -> float:
    """Half of the Student t interval of a mean from n values with sample standard deviation stddev."""
    return t_quantile(confidence, n - 1) * stddev / math.sqrt(n)


def summarize(values: Sequence[float]) -> Summary:
    """Mean, median, sample standard deviation, BenchmarkDotNet's Error and a t interval of the mean."""
    if not values:
        raise ValueError("summarize needs at least one value")
    n = len(values)
    mean = statistics.fmean(values)
    stddev = statistics.stdev(values) if n > 1 else None
    ci = half_width(stddev, n, CONFIDENCE) if stddev is not None else None
    return Summary(
        n=n,
        mean=mean,
        median=statistics.median(values),
        stddev=stddev,
        error=half_width(stddev, n, ERROR_CONFIDENCE) if stddev is not None else None,
        ci_low=mean - ci if ci is not None else None,
        ci_high=mean + ci if ci is not None else None,
        minimum=min(values),
        maximum=max(values),
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
    error) with Welch-Satterthwaite degrees of freedom (scipy's Welch test and its
    confidence_interval), so "significant" (p below 1 - confidence) and "the interval
    excludes 1" always agree.
    """
    if not candidate or not baseline:
        raise ValueError("ratio needs values on both sides")
    estimate = statistics.fmean(candidate) / statistics.fmean(baseline)
    if min(*candidate, *baseline) <= 0:
        return Ratio(estimate, None, None, None, None, "n/a: values not positive")
    if len(candidate) < 2 or len(baseline) < 2:
        return Ratio(estimate, None, None, None, None, ONE_REPEAT)
    log_c = [math.log(v) for v in candidate]
    log_b = [math.log(v) for v in baseline]
    difference = statistics.fmean(log_c) - statistics.fmean(log_b)
    if len(set(log_c)) == 1 and len(set(log_b)) == 1:
        # No spread on either side (e.g. bytes per response): any difference is real.
        same = difference == 0
        point = math.exp(difference)
        return Ratio(point, point, point, 1.0 if same else 0.0, not same)
    with warnings.catch_warnings():
        # One side without spread is exact (variance 0), not the precision loss scipy warns of.
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        welch = scipy_stats.ttest_ind(log_c, log_b, equal_var=False)
        interval = welch.confidence_interval(confidence_level=confidence)
    p_value = float(welch.pvalue)
    return Ratio(
        estimate=math.exp(difference),
        low=math.exp(float(interval.low)),
        high=math.exp(float(interval.high)),
        p_value=p_value,
        significant=p_value < 1 - confidence,
    )
