"""Which rungs of a ladder run: a rung's offered rate must stay within its share of what the target
served under the closed model earlier in the same run, judged from the results on disk, so that
--resume judges each rung as the first session would have."""

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from labrunner.model.scenario import Scenario


def closed_capacity(scenario: Scenario, results: Iterable[Mapping[str, Any]]) -> float | None:
    """The req/s the scenario's target served under its rung's capacity model, all else the same
    (profile, count, response model, network): the geometric mean of the successful repeats, None
    without one (or when the scenario is no rung)."""
    rung = scenario.load_model.rung
    if rung is None:
        return None
    group = scenario.group_under(rung.capacity_model)
    served = [
        rps
        for r in results
        if r.get("status") == "ok" and r["scenario"]["group"] == group
        if (rps := ((r.get("k6") or {}).get("metrics") or {}).get("requests_per_second"))
    ]
    return statistics.geometric_mean(served) if served else None


def not_run_reason(scenario: Scenario, results: Iterable[Mapping[str, Any]]) -> str | None:
    """Why a rung is not run, None when it runs (as does every scenario that is no rung)."""
    model = scenario.load_model
    if model.rung is None or model.rate is None:
        return None
    capacity = closed_capacity(scenario, results)
    if capacity is None:
        return (
            f"no successful {model.rung.capacity_model}-model result of this target in this run "
            f"to judge {model.rate} req/s by"
        )
    if model.rate > model.rung.max_share * capacity:
        return (
            f"{model.rate} req/s is over {model.rung.max_share:.0%} of its {_rate(capacity)} req/s "
            "closed-model capacity in this run"
        )
    return None


def _rate(value: float) -> str:
    """12.3, 758: a rate as the progress lines write one, never an exponent."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
