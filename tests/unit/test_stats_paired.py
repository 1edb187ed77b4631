"""The paired ratio (a run's rounds), the equivalence test at its margins, Holm's cap and the
statistics' edge cases, against values worked out by hand from printed t tables."""

import math

import pytest
from labrunner.report.stats import (
    NOT_POSITIVE,
    ONE_REPEAT,
    Ratio,
    Summary,
    holm,
    paired_ratio,
    ratio,
    summarize,
)
from scipy import stats as scipy_stats

T_975_DF2 = 4.3027  # two-sided 95%, 2 degrees of freedom (printed tables)
T_95_DF2 = 2.9200  # one-sided 95% (the two-sided 90% of TOST), 2 degrees of freedom
# Three rounds whose baselines differ widely (the host sped and slowed), each round's log ratio
# 1, 2 and 3: mean 2, standard deviation 1, standard error 1/√3.
BASELINE = [100.0, 50.0, 400.0]
CANDIDATE = [b * math.exp(d) for b, d in zip(BASELINE, (1, 2, 3), strict=True)]


def test_paired_ratio_worked_by_hand() -> None:
    r = paired_ratio(CANDIDATE, BASELINE)
    margin = T_975_DF2 / math.sqrt(3)  # 2.4841
    assert r.estimate == pytest.approx(math.e**2)
    assert r.low == pytest.approx(math.exp(2 - margin), rel=1e-4)  # 0.6162
    assert r.high == pytest.approx(math.exp(2 + margin), rel=1e-4)  # 88.60
    # t = 2 / (1/√3) = 3.4641 with 2 degrees of freedom: two-sided p = 0.0742, not below 0.05.
    assert r.p_value == pytest.approx(2 * scipy_stats.t.sf(2 * math.sqrt(3), 2), rel=1e-9)
    assert r.p_value == pytest.approx(0.0742, abs=1e-4)
    assert (r.significant, r.equivalent, r.note) == (False, False, "")
    # The same repeats unpaired: Welch's test sees the rounds' spread, not the ratio's.
    assert ratio(CANDIDATE, BASELINE).low != pytest.approx(r.low, rel=1e-3)


def test_paired_ratio_of_values_below_one_is_the_same_test() -> None:
    # Latency in seconds, CPU seconds per request: positive and below 1, still paired.
    small = paired_ratio([c / 1000 for c in CANDIDATE], [b / 1000 for b in BASELINE])
    assert (small.estimate, small.low, small.high, small.p_value) == pytest.approx(
        (math.e**2, math.exp(2 - T_975_DF2 / math.sqrt(3)), math.exp(2 + T_975_DF2 / math.sqrt(3)), 0.0742),
        rel=1e-3,
    )


@pytest.mark.parametrize(
    ("spread", "equivalent"),
    [
        # Log ratios -s, 0, s: sd s, the 90% interval exp(± 2.92 s/√3).
        (0.03, True),  # ± 0.0506: [0.951, 1.052], inside ±10%
        (0.065, False),  # ± 0.1096: [0.896, 1.116]; an 85% interval (± 0.0856) would be inside
    ],
)
def test_equivalence_is_the_ninety_percent_interval_within_ten_percent(
    spread: float, equivalent: bool
) -> None:
    baseline = [100.0, 200.0, 300.0]
    candidate = [b * math.exp(d) for b, d in zip(baseline, (-spread, 0.0, spread), strict=True)]
    half_width = T_95_DF2 * spread / math.sqrt(3)
    assert (math.exp(-half_width) >= 0.9 and math.exp(half_width) <= 1.1) is equivalent  # by hand
    r = paired_ratio(candidate, baseline)
    assert r.estimate == pytest.approx(1.0) and r.significant is False
    assert r.equivalent is equivalent


def test_rounds_with_one_ratio_are_exact_and_the_margin_is_inclusive() -> None:
    double = paired_ratio([200.0, 400.0, 60.0], [100.0, 200.0, 30.0])
    assert (double.estimate, double.low, double.high) == pytest.approx((2.0, 2.0, 2.0))
    assert (double.p_value, double.significant, double.equivalent) == (0.0, True, False)
    same = paired_ratio([100.0, 200.0], [100.0, 200.0])
    assert (same.estimate, same.p_value, same.significant, same.equivalent) == (1.0, 1.0, False, True)
    # Exactly 10% either way is within the margin (these ratios are 0.9 and 1.1 to the last bit).
    low, high = paired_ratio([90.0, 180.0], [100.0, 200.0]), paired_ratio([2.2, 2.2], [2.0, 2.0])
    assert (low.estimate, high.estimate) == (0.9, 1.1)
    assert low.equivalent is True and high.equivalent is True
    assert low.significant is True  # a difference all the same: every round says 0.9
    # Without spread on either side (Welch's path): the same verdicts.
    assert ratio([5.0, 5.0], [5.0, 5.0]).equivalent is True
    assert ratio([7.0, 7.0], [5.0, 5.0]).equivalent is False


def test_one_round_has_no_test() -> None:
    assert paired_ratio([300.0], [100.0]) == Ratio(3.0, None, None, None, None, ONE_REPEAT)


def test_a_value_not_positive_falls_back_to_the_arithmetic_ratio() -> None:
    assert paired_ratio([0.0, 2.0], [1.0, 1.0]) == Ratio(1.0, None, None, None, None, NOT_POSITIVE)
    assert paired_ratio([1.0, 1.0], [0.0, 4.0]) == Ratio(0.5, None, None, None, None, NOT_POSITIVE)
    assert ratio([0.0, 2.0], [1.0, 1.0]) == Ratio(1.0, None, None, None, None, NOT_POSITIVE)


def test_unequal_or_empty_sides_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^paired_ratio needs the same number of values on both sides$"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match=r"^paired_ratio needs the same number of values on both sides$"):
        paired_ratio([], [])
    with pytest.raises(ValueError, match=r"^ratio needs values on both sides$"):
        ratio([], [1.0])
    with pytest.raises(ValueError, match=r"^ratio needs values on both sides$"):
        ratio([1.0], [])
    with pytest.raises(ValueError, match=r"^summarize needs at least one value$"):
        summarize([])


def test_a_summary_with_a_value_not_positive_keeps_its_count_and_range() -> None:
    assert summarize([0.0, 2.0, 4.0]) == Summary(3, 2.0, None, None, 0.0, 4.0, NOT_POSITIVE)


def test_holm_never_adjusts_beyond_one() -> None:
    # 2 x 0.6 = 1.2 and 1 x 0.7: both capped at 1, then non-decreasing.
    assert holm([0.6, 0.7]) == [1.0, 1.0]
    assert holm([0.03, 0.6]) == [0.06, 0.6]
    assert holm([]) == []
