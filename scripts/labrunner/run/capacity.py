"""Capacity search: step the arrival rate until p99, errors or dropped iterations break the SLO."""

import math
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from labrunner.backends.base import Backend, ScenarioFailed, ServiceHandle
from labrunner.model.scenario import CapacitySearch, LoadModel, vus_for_rate
from labrunner.run.k6.execute import execute
from labrunner.run.k6.invocation import K6Setup
from labrunner.run.k6.result import EXIT_THRESHOLDS_CROSSED, K6Run
from labrunner.say import Say

COOLDOWN_S = 1.0  # between steps, so the service finishes what the last k6 run abandoned
RESOLUTION = 0.05  # stop bisecting once failing - passing rate is below this share of the passing one
_CPU_SAMPLE = "protolab_cgroup_cpu_usage_seconds_total"
_LIMIT_SAMPLE = "protolab_cgroup_cpu_limit_cores"


@dataclass(frozen=True)
class Step:
    """One k6 run at a fixed arrival rate and whether it met the SLO."""

    number: int
    rate: int  # offered requests per second
    vus: int
    passed: bool
    reasons: tuple[str, ...]  # why it failed; empty when it passed
    requests_per_second: float
    p99_ms: float | None
    error_rate: float | None
    dropped_iterations: int
    k6_cpu_utilisation: float | None
    service_cpu_utilisation: float | None  # from the service's metrics endpoint; None without one


@dataclass(frozen=True)
class Outcome:
    """The steps of one search and what they add up to."""

    settings: CapacitySearch
    steps: tuple[Step, ...]
    sustainable_rate: int | None  # highest passing rate below the lowest failing one
    limit: str  # what stopped the search
    run: K6Run  # the k6 run the scenario result reports: at the sustainable rate, else the first step

    def as_dict(self) -> dict[str, Any]:
        """The result's "capacity" section."""
        return {
            **asdict(self.settings),
            "sustainable_rate": self.sustainable_rate,
            "limit": self.limit,
            "steps": [asdict(step) for step in self.steps],
        }


def next_rate(steps: Sequence[Step], search: CapacitySearch) -> int | None:
    """The rate of the next step, None when the search is done.

    Grow by `growth` while every step passes; after a failure, bisect between the highest
    passing and the lowest failing rate until they are RESOLUTION apart; when even the
    first rate fails, step down by `growth` to find any sustainable rate.
    """
    if not steps or len(steps) >= search.max_steps:
        return None
    tried = {s.rate for s in steps}
    failed = [s.rate for s in steps if not s.passed]
    if not failed:
        return max(steps[-1].rate + 1, math.ceil(steps[-1].rate * search.growth))
    high = min(failed)
    low = sustainable(steps)
    if low is None:
        rate = math.floor(high / search.growth)
        return rate if rate >= 1 and rate not in tried else None
    if high - low <= max(1.0, RESOLUTION * low):
        return None
    return (low + high) // 2


def sustainable(steps: Sequence[Step]) -> int | None:
    """The highest passing rate below every failing one (a lucky pass above a failure does not count)."""
    ceiling = min((s.rate for s in steps if not s.passed), default=math.inf)
    return max((s.rate for s in steps if s.passed and s.rate < ceiling), default=None)


def search(k6_setup: K6Setup, backend: Backend, say: Say) -> Outcome:
    """Run steps until next_rate says stop; a step k6 could not run ends the scenario (ScenarioFailed)."""
    model, handle = k6_setup.scenario.load_model, k6_setup.handle
    settings = model.search
    if settings is None or model.rate is None:
        raise ValueError(f"load model {model.name} has no capacity search")
    steps: list[Step] = []
    runs: dict[int, K6Run] = {}
    rate: int | None = model.rate
    while rate is not None:
        if steps:
            time.sleep(COOLDOWN_S)
        step_model = _step_model(model, rate, settings)
        before = service_cpu(handle)
        began = time.monotonic()
        run = execute(backend, handle, k6_setup.step(step_model, len(steps) + 1), measured=True)
        cpu = _cpu_delta(before, service_cpu(handle))
        wall = time.monotonic() - began
        step = _evaluate(len(steps) + 1, step_model, run, settings, cpu=cpu, wall_seconds=wall)
        say(f"    step {step.number}: {rate}/s -> {_describe(step)}")
        steps.append(step)
        runs.setdefault(rate, run)
        rate = next_rate(steps, settings)
    best = sustainable(steps)
    return Outcome(
        settings=settings,
        steps=tuple(steps),
        sustainable_rate=best,
        limit=_limit(steps),
        run=runs[best] if best is not None else runs[steps[0].rate],
    )


def _step_model(model: LoadModel, rate: int, settings: CapacitySearch) -> LoadModel:
    """The step's open model: VUs for its rate with the SLO as the latency bound."""
    max_vus = model.max_vus or 1
    vus = vus_for_rate(rate, settings.slo_p99_ms / 1000, model.pre_allocated_vus or 1, max_vus)
    return replace(model, rate=rate, pre_allocated_vus=vus, max_vus=max(vus, max_vus))


def _evaluate(
    number: int,
    model: LoadModel,
    run: K6Run,
    settings: CapacitySearch,
    *,
    cpu: tuple[float, float] | None,
    wall_seconds: float,
) -> Step:
    """cpu: (CPU seconds the service used during the step, its limit in cores)."""
    rate = model.rate or 0
    metrics = run.metrics
    if metrics is None or run.exit_code not in (0, EXIT_THRESHOLDS_CROSSED):
        message = f"capacity step {number} at {rate}/s: k6 exited with code {run.exit_code}"
        raise ScenarioFailed("measure", message, run.output_tail)
    # The service idles while k6 starts its VUs: k6's load time is the fairer denominator.
    seconds = metrics.test_run_seconds or wall_seconds
    p99 = metrics.latency_ms.get("p99")
    reasons = []
    if metrics.requests == 0 or p99 is None:
        reasons.append("no successful requests")
    elif p99 > settings.slo_p99_ms:
        reasons.append(f"p99 {p99:.1f} ms > SLO {settings.slo_p99_ms:g} ms")
    if metrics.error_rate is not None and metrics.error_rate > settings.max_error_rate:
        reasons.append(f"errors {metrics.error_rate:.2%} > {settings.max_error_rate:.0%}")
    if metrics.dropped_iterations:
        reasons.append(f"{metrics.dropped_iterations} iterations dropped")
    return Step(
        number=number,
        rate=rate,
        vus=model.pre_allocated_vus or 0,
        passed=not reasons,
        reasons=tuple(reasons),
        requests_per_second=metrics.requests_per_second,
        p99_ms=p99,
        error_rate=metrics.error_rate,
        dropped_iterations=metrics.dropped_iterations,
        k6_cpu_utilisation=run.cpu_utilisation,
        service_cpu_utilisation=cpu[0] / (cpu[1] * seconds) if cpu is not None and seconds > 0 else None,
    )


def _limit(steps: Sequence[Step]) -> str:
    failed = [s for s in steps if not s.passed]
    if not failed:
        return f"not reached: every one of {len(steps)} steps passed (capacity is above {steps[-1].rate}/s)"
    lowest = min(failed, key=lambda s: s.rate)
    where = f"at {lowest.rate}/s: {'; '.join(lowest.reasons)}"
    if sustainable(steps) is None:
        return f"below {steps[-1].rate}/s, the lowest rate tried ({where})"
    return where


def _describe(step: Step) -> str:
    p99 = f"p99 {step.p99_ms:.1f} ms" if step.p99_ms is not None else "no p99"
    verdict = "ok" if step.passed else "FAILED: " + "; ".join(step.reasons)
    return f"{step.requests_per_second:.0f} req/s, {p99}, {verdict}"


def service_cpu(handle: ServiceHandle) -> tuple[float, float] | None:
    """(CPU seconds used, CPU limit in cores) from the service's own cgroup metrics."""
    if handle.metrics_address is None:
        return None
    try:
        with urllib.request.urlopen(f"http://{handle.metrics_address}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (_CPU_SAMPLE, _LIMIT_SAMPLE)
    }
    if _CPU_SAMPLE not in values or not values.get(_LIMIT_SAMPLE):
        return None
    return values[_CPU_SAMPLE], values[_LIMIT_SAMPLE]


def _cpu_delta(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> tuple[float, float] | None:
    if before is None or after is None:
        return None
    return after[0] - before[0], after[1]
