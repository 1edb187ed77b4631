"""Unit tests: summaries and ratio tests against values worked out by hand from printed t tables."""

import math
import random
import warnings

import pytest
from labrunner.report.stats import (
    NOT_POSITIVE,
    ONE_REPEAT,
    Ratio,
    half_width,
    paired_ratio,
    ratio,
    summarize,
    t_quantile,
)
from scipy import stats as scipy_stats

# Student t critical values as printed in statistics tables (two-sided).
T_975_DF4 = 2.7764  # 95%, 4 degrees of freedom
T_9995_DF4 = 8.6103  # 99.9%, 4 degrees of freedom


@pytest.mark.parametrize(
    ("confidence", "df", "table"),
    [(0.95, 1, 12.706), (0.95, 4, T_975_DF4), (0.95, 10, 2.228), (0.999, 2, 31.599), (0.999, 4, T_9995_DF4)],
)
def test_t_quantile_matches_the_printed_table(confidence: float, df: int, table: float) -> None:
    assert t_quantile(confidence, df) == pytest.approx(table, abs=5e-4)


def test_summary_of_a_known_sample() -> None:
    # Logs 0, 1, 2, 3, 4 (values e^0 .. e^4): mean 2, squared deviations 4+1+0+1+4 = 10, variance
    # 10/4, standard error sqrt(2.5)/sqrt(5) = sqrt(0.5); the centre is e^2, the interval
    # e^(2 +- 2.7764 * 0.70711) = e^(2 +- 1.96324).
    values = [math.e**k for k in (2, 4, 0, 3, 1)]
    s = summarize(values)
    assert (s.n, s.minimum, s.maximum, s.note) == (5, 1.0, math.e**4, "")
    assert s.centre == pytest.approx(math.e**2)
    assert s.low == pytest.approx(math.exp(2 - T_975_DF4 * math.sqrt(0.5)), rel=1e-3)  # 1.0372
    assert s.high == pytest.approx(math.exp(2 + T_975_DF4 * math.sqrt(0.5)), rel=1e-3)  # 52.641
    assert half_width(math.sqrt(2.5), 5, 0.95) == pytest.approx(1.96324, abs=1e-4)


def test_a_wide_sample_keeps_its_interval_above_zero() -> None:
    # Three p50s (ms) whose Student t interval of the mean, [-85.1, 153.8], crosses zero.
    s = summarize([5.0, 8.0, 90.0])
    assert s.low is not None and s.high is not None
    assert 0 < s.low < s.centre < s.high
    assert s.centre == pytest.approx((5 * 8 * 90) ** (1 / 3))


def test_summary_of_one_value_has_no_interval() -> None:
    s = summarize([42.0])
    assert (s.n, s.centre, s.low, s.high, s.note) == (1, 42.0, None, None, ONE_REPEAT)
    with pytest.raises(ValueError):
        summarize([])


def test_summary_with_a_zero_falls_back_to_the_arithmetic_mean() -> None:
    s = summarize([0.0, 2.0, 4.0])
    assert (s.centre, s.low, s.high, s.note) == (2.0, None, None, NOT_POSITIVE)


def test_ratio_worked_by_hand() -> None:
    # Logs 1,2,3 against 0,1,2: difference 1, each variance 1 over 3 values, so the
    # standard error is sqrt(2/3) and Welch's degrees of freedom are (2/3)^2 / (2 * (1/3)^2 / 2) = 4.
    r = ratio([math.e, math.e**2, math.e**3], [1.0, math.e, math.e**2])
    margin = T_975_DF4 * math.sqrt(2 / 3)
    assert r.estimate == pytest.approx(math.e)
    assert r.low == pytest.approx(math.exp(1 - margin), rel=1e-3)
    assert r.high == pytest.approx(math.exp(1 + margin), rel=1e-3)
    # t = 1 / sqrt(2/3) = 1.2247 with 4 df: two-sided p = 0.288.
    assert r.p_value == pytest.approx(0.288, abs=1e-3)
    assert r.significant is False


def test_ratio_agrees_with_scipys_welch_test_on_logs() -> None:
    candidate, baseline = [510.0, 530.0, 495.0, 520.0], [480.0, 470.0, 505.0]
    r = ratio(candidate, baseline)
    expected = scipy_stats.ttest_ind(_logs(candidate), _logs(baseline), equal_var=False)
    assert r.p_value == pytest.approx(expected.pvalue)


def _logs(values: list[float]) -> list[float]:
    return [math.log(v) for v in values]


def test_clearly_different_repeats_are_significant() -> None:
    r = ratio([200.0, 204.0, 197.0, 201.0], [100.0, 101.0, 99.0, 100.5])
    assert r.significant is True
    assert r.low is not None and r.high is not None
    assert 1 < r.low < 2 < r.high
    assert r.p_value is not None and r.p_value < 0.05


def test_overlapping_repeats_are_not_significant() -> None:
    r = ratio([100.0, 120.0, 90.0], [105.0, 95.0, 115.0])
    assert r.significant is False
    assert r.low is not None and r.high is not None
    assert r.low < 1 < r.high


def test_significance_and_the_interval_always_agree() -> None:
    for shift in (1.0, 1.02, 1.05, 1.1, 1.2, 1.5):
        r = ratio([100 * shift, 104 * shift, 97 * shift], [100.0, 103.0, 98.0])
        assert r.low is not None and r.high is not None
        assert r.significant == (not r.low <= 1 <= r.high), shift


def test_ratio_is_symmetric() -> None:
    a, b = [3.0, 3.3, 2.9], [2.0, 2.2, 2.1]
    forward, backward = ratio(a, b), ratio(b, a)
    assert forward.estimate == pytest.approx(1 / backward.estimate)
    assert forward.low == pytest.approx(1 / backward.high)  # type: ignore[operator]
    assert forward.p_value == pytest.approx(backward.p_value)


def test_one_repeat_cannot_be_tested() -> None:
    r = ratio([200.0], [100.0, 110.0])
    assert r == Ratio(pytest.approx(200 / math.sqrt(100 * 110)), None, None, None, None, ONE_REPEAT)
    assert ratio([1.0, 2.0], [3.0]).note == "n/a: one repeat"


def test_no_spread_on_either_side() -> None:
    assert ratio([7627.0, 7627.0], [18472.0, 18472.0]).significant is True
    same = ratio([5.0, 5.0], [5.0, 5.0])
    assert (same.estimate, same.significant, same.p_value) == (1.0, False, 1.0)


def test_values_that_are_not_positive() -> None:
    r = ratio([0.0, 1.0], [1.0, 2.0])
    assert r.significant is None and "not positive" in r.note


# ratio() before it used scipy's Welch test derived the Welch-Satterthwaite degrees of freedom,
# standard error and p-value by hand; these are its results on fixed repeats (estimate, low, high,
# p-value at the given confidence), which the scipy-based computation must reproduce.
HAND_DERIVED_WELCH = [
    (
        [510.0, 530.0, 495.0, 520.0],
        [480.0, 470.0, 505.0],
        0.95,
        (1.0594248508280468, 0.9843040840072556, 1.1402787337655258, 0.0933930134210123),
    ),
    (
        [510.0, 530.0, 495.0, 520.0],
        [480.0, 470.0, 505.0],
        0.99,
        (1.0594248508280468, 0.9356438149296961, 1.1995815038186988, 0.0933930134210123),
    ),
    (
        [200.0, 204.0, 197.0, 201.0],
        [100.0, 101.0, 99.0, 100.5],
        0.95,
        (2.002395931219713, 1.959449528704635, 2.046283615182446, 7.121520663027208e-09),
    ),
    (
        [100.0, 120.0, 90.0],
        [105.0, 95.0, 115.0],
        0.99,
        (0.9801013865484826, 0.5845650512404033, 1.6432708829854596, 0.8527323861005329),
    ),
    (
        [3.1, 2.7, 3.6, 2.9, 3.3],
        [2.2, 2.5],
        0.95,
        (1.32375201611643, 0.9791485614141892, 1.7896358828750456, 0.05814009593352863),
    ),
    # No spread on one side only: still a Welch test, whose degrees of freedom come from the other.
    (
        [1.0, 2.0],
        [3.0, 3.0],
        0.95,
        (0.4714045207910317, 0.0057665938543668875, 38.536132045078766, 0.27491551985182994),
    ),
]


@pytest.mark.parametrize(("candidate", "baseline", "confidence", "expected"), HAND_DERIVED_WELCH)
def test_scipy_welch_reproduces_the_hand_derived_results(
    candidate: list[float],
    baseline: list[float],
    confidence: float,
    expected: tuple[float, float, float, float],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a side without spread is exact, not a precision warning
        r = ratio(candidate, baseline, confidence)
    estimate, low, high, p_value = expected
    assert (r.estimate, r.low, r.high) == pytest.approx((estimate, low, high), rel=1e-9)
    assert r.p_value == pytest.approx(p_value, rel=1e-9)
    assert r.significant is (p_value < 1 - confidence)
    assert r.note == ""


@pytest.mark.parametrize("seed", range(12))
def test_both_t_tests_equal_scipy_stats_own(seed: int) -> None:
    """ratio() is Welch's test and paired_ratio() the paired one, as scipy.stats computes them: the
    same p-value, interval and TOST interval (the module computes them from scipy.special, which
    imports in a fraction of scipy.stats' time)."""
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    candidate = [rng.lognormvariate(0.05 * seed, 0.1) for _ in range(n)]
    baseline = [
        rng.lognormvariate(0.0, 0.1 + 0.02 * seed) for _ in range(n if seed % 2 else rng.randint(2, 9))
    ]
    tests = [
        (
            ratio(candidate, baseline),
            scipy_stats.ttest_ind(_logs(candidate), _logs(baseline), equal_var=False),
        )
    ]
    if len(baseline) == n:
        tests.append(
            (paired_ratio(candidate, baseline), scipy_stats.ttest_rel(_logs(candidate), _logs(baseline)))
        )
    for ours, theirs in tests:
        interval, tost = theirs.confidence_interval(0.95), theirs.confidence_interval(0.90)
        assert ours.p_value == pytest.approx(float(theirs.pvalue), rel=1e-9, abs=1e-15)
        assert ours.low == pytest.approx(math.exp(interval.low), rel=1e-9)
        assert ours.high == pytest.approx(math.exp(interval.high), rel=1e-9)
        assert ours.equivalent == (math.exp(tost.low) >= 0.9 and math.exp(tost.high) <= 1.1)
