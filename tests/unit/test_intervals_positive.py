"""Property: no interval printed for a positive quantity goes below zero, and each holds its centre."""

from hypothesis import given
from hypothesis import strategies as st
from labrunner.report.cells import interval_cell
from labrunner.report.stats import ratio, summarize
from labrunner.results.trust import MAX_INTERVAL_WIDTH

# Positive repeats as the lab measures them: req/s, latency in ms, CPU seconds, bytes; 1 to 10 of them.
repeats = st.lists(
    st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False), min_size=1, max_size=10
)


@given(repeats)
def test_a_summary_interval_stays_above_zero_and_holds_its_centre(values: list[float]) -> None:
    s = summarize(values)
    assert s.centre > 0
    if s.low is None or s.high is None:
        assert len(values) == 1 and s.note
        return
    assert 0 < s.low <= s.centre <= s.high
    cell = interval_cell(s, "p50")
    if s.high / s.low > MAX_INTERVAL_WIDTH:  # too wide to use: no bounds, the rounds it needs
        assert cell.startswith("— (too few rounds: about ")
        return
    printed = cell.strip("[]").split(", ")
    assert all(float(bound) >= 0 for bound in printed)


@given(repeats, repeats)
def test_a_ratio_interval_stays_above_zero_and_holds_its_estimate(
    candidate: list[float], baseline: list[float]
) -> None:
    r = ratio(candidate, baseline)
    assert r.estimate > 0
    if r.low is None or r.high is None:
        assert min(len(candidate), len(baseline)) == 1 and r.significant is None
        return
    assert 0 < r.low <= r.estimate <= r.high
