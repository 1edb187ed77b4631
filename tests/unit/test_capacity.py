"""Capacity search: the stepping rule on simulated services and its settings."""

from pathlib import Path

import pytest
from labrunner.model.matrix import load_matrix
from labrunner.model.scenario import CapacitySearch
from labrunner.model.schema import MatrixError
from labrunner.run.capacity import RESOLUTION, Step, next_rate, sustainable

from tests.support import ROOT


def _step(number: int, rate: int, passed: bool) -> Step:
    return Step(number, rate, 10, passed, () if passed else ("p99 too high",), rate, 1.0, 0.0, 0, 0.2, 0.5)


def _simulate(capacity: int, start: int, max_steps: int) -> list[Step]:
    """Search a service that meets the SLO up to `capacity` requests/s."""
    search = CapacitySearch(slo_p99_ms=100, max_error_rate=0.01, max_steps=max_steps, growth=2.0)
    steps: list[Step] = []
    rate: int | None = start
    while rate is not None:
        steps.append(_step(len(steps) + 1, rate, rate <= capacity))
        rate = next_rate(steps, search)
    return steps


def test_grows_then_bisects_within_the_step_budget() -> None:
    steps = _simulate(capacity=430, start=50, max_steps=8)
    assert [s.rate for s in steps] == [50, 100, 200, 400, 800, 600, 500, 450]
    assert sustainable(steps) == 400


def test_with_enough_steps_it_converges_to_the_resolution() -> None:
    for capacity in (73, 430, 1999):
        steps = _simulate(capacity=capacity, start=50, max_steps=30)
        found = sustainable(steps)
        assert found is not None and found <= capacity
        assert found >= capacity * (1 - 2 * RESOLUTION), (capacity, [s.rate for s in steps])
        assert len(steps) < 30  # it stopped on the resolution, not the budget


def test_steps_down_when_the_first_rate_already_fails() -> None:
    steps = _simulate(capacity=20, start=50, max_steps=12)
    assert [s.rate for s in steps][:3] == [50, 25, 12]
    assert sustainable(steps) == 20


def test_nothing_sustainable() -> None:
    steps = _simulate(capacity=0, start=4, max_steps=10)
    assert [s.rate for s in steps] == [4, 2, 1]
    assert sustainable(steps) is None


def test_a_lucky_pass_above_a_failure_does_not_count() -> None:
    steps = [_step(1, 100, True), _step(2, 200, False), _step(3, 150, True), _step(4, 175, False)]
    steps.append(_step(5, 250, True))
    assert sustainable(steps) == 150


def test_search_settings_are_validated(tmp_path: Path) -> None:
    text = (ROOT / "matrix.toml").read_text()
    assert load_matrix(ROOT / "matrix.toml").load_models["capacity"].search == CapacitySearch(
        100.0, 0.01, 8, 2.0
    )
    bad = tmp_path / "matrix.toml"
    bad.write_text(text.replace("growth = 2.0", "growth = 1.0"))
    with pytest.raises(MatrixError, match=r"\[load_models.capacity\] search growth"):
        load_matrix(bad)
    bad.write_text(
        text.replace('executor = "constant-vus"\nvus = 10', 'executor = "constant-vus"\nvus = 10\nsearch = 1')
    )
    with pytest.raises(MatrixError, match="unknown key 'search'"):
        load_matrix(bad)
