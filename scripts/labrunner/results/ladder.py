"""A ladder rung's rate: its share of what the target served under the closed model earlier in the
same run, set when the rung is about to run and judged from the results on disk, so that --resume
sets each rung as the first session did."""

import statistics
from collections.abc import Iterable
from dataclasses import replace

from labrunner.model.scenario import Scenario, vus_for_rate
from labrunner.results.result import Result


def closed_capacity(scenario: Scenario, results: Iterable[Result]) -> float | None:
    """The req/s the scenario's target served under its rung's capacity model, all else the same
    (profile, count, response model, network): the geometric mean of every successful result of that
    target, alone or beside a duet partner (a duet's result names its target's group apart, as
    "target_group"), None without one (or when the scenario is no rung)."""
    rung = scenario.load_model.rung
    if rung is None:
        return None
    group = scenario.group_under(rung.capacity_model)
    served = [
        rps
        for r in results
        if r.status == "ok" and r.scenario.target_group == group and r.metrics
        if (rps := r.metrics.requests_per_second)
    ]
    return statistics.geometric_mean(served) if served else None


def resolve(scenario: Scenario, results: Iterable[Result]) -> Scenario | str:
    """The scenario as it runs: a rung at its share of its target's capacity (at least 1/s), with VUs
    for that rate within its load model's; or why it is not run. Any other scenario as it is."""
    model = scenario.load_model
    rung = model.rung
    if rung is None:
        return scenario
    capacity = closed_capacity(scenario, results)
    if capacity is None:
        return (
            f"no successful {rung.capacity_model}-model result of this target in this run "
            f"to take {rung.share:.0%} of"
        )
    rate = max(1, round(rung.share * capacity))
    assert model.pre_allocated_vus is not None and model.max_vus is not None  # a rung's table sets both
    vus = vus_for_rate(rate, rung.latency_bound_s, model.pre_allocated_vus, model.max_vus)
    return replace(scenario, load_model=replace(model, rate=rate, pre_allocated_vus=vus))
