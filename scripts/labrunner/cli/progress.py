"""Progress lines: each scenario starting with the elapsed time and an ETA, its outcome in one short
line when it is kept, and the rungs not run."""

import time
from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.model.scenario import Scenario
from labrunner.observe import interference
from labrunner.results.trust import Verdict
from labrunner.run.outcome import ScenarioOutcome
from labrunner.say import Say

ASSUMED_OVERHEAD_S = 5.0  # per scenario, for the ETA until one has been measured


@dataclass(frozen=True)
class Kept:
    """A finished scenario as the session reports it: its outcome (failed when its result could not
    be written), the verdict on it, and what of it could not be written."""

    outcome: ScenarioOutcome
    verdict: Verdict
    problems: tuple[str, ...] = ()


class Progress:
    """Progress lines with elapsed time and an ETA from the overhead measured so far (the time each
    scenario added beyond k6's, its finish excluded when it overlapped the next scenario)."""

    def __init__(self, scenarios: tuple[Scenario, ...], done: set[str], say: Say) -> None:
        self._pending = [s for s in scenarios if s.id not in done]
        self._total = len(scenarios)
        self._began = time.monotonic()
        self._overheads: list[float] = []
        self._say = say

    def starting(self, index: int, scenario: Scenario) -> None:
        """The ETA counts this scenario and those after it: an earlier one may still be finishing,
        but its measured window, which the ETA counts, is over."""
        overhead = sum(self._overheads) / len(self._overheads) if self._overheads else ASSUMED_OVERHEAD_S
        eta = sum(s.warmup_s + s.measured_seconds + overhead for s in self._pending)
        self._say(
            f"[{index}/{self._total}] {scenario.id}: starting "
            f"(elapsed {_clock(time.monotonic() - self._began)}, ETA {_clock(eta)})"
        )

    def measured(self, scenario: Scenario) -> None:
        if scenario in self._pending:
            self._pending.remove(scenario)

    def extend(self, scenarios: Sequence[Scenario]) -> int:
        """Scenarios added to the run (a --precision round); returns the first one's index."""
        self._pending += scenarios
        self._total += len(scenarios)
        return self._total - len(scenarios) + 1

    def not_run(self, index: int, scenario: Scenario, reason: str) -> None:
        self.measured(scenario)  # out of the ETA
        self._say(f"[{index}/{self._total}] {scenario.id}: not run: {reason}")

    def finished(self, index: int, kept: Kept) -> None:
        outcome = kept.outcome
        self._overheads.append(outcome.timings_s["overhead"])
        line = outcome_line(outcome, kept.verdict)
        problems = "".join(f"\n    note: {outcome.scenario.id}: {problem}" for problem in kept.problems)
        self._say(f"[{index}/{self._total}] {outcome.scenario.id}: {line}{problems}")


def outcome_line(outcome: ScenarioOutcome, verdict: Verdict) -> str:
    """A finished scenario in one short line (about 150 characters with its id): its numbers, a flag
    per kind of suspect reason (the reasons in words are in summary.md), or why it failed."""
    timings = outcome.timings_s
    took = f"({timings['total']:.1f} s)"  # the overhead is in the result's timings and in the ETA
    failure = outcome.failure
    if failure is not None:
        detail = f"\n    {failure.log_tail.strip()[-2000:]}" if failure.log_tail.strip() else ""
        return f"FAILED in {failure.phase}: {failure.message} {took}{detail}"
    metrics = outcome.k6_run.metrics if outcome.k6_run else None
    parts = ["ok"]
    if metrics is not None:
        at_least = ">=" if verdict.lower_bound else ""  # the service can do at least this much
        p99 = metrics.latency_ms.get("p99")
        parts = [
            f"ok {at_least}{_figure(metrics.requests_per_second)} req/s",
            f"p99 {'n/a' if p99 is None else _figure(p99)} ms",
            f"{metrics.errors} err",
        ]
    service_cpu = outcome.service_cpu_utilisation
    if service_cpu is not None:
        parts.append(f"svc {service_cpu:.0%}")
    k6_cpu = outcome.k6_run.cpu_utilisation if outcome.k6_run else None
    if k6_cpu is not None:
        parts.append(f"k6 {k6_cpu:.0%}")
    parts.append(interference.describe(outcome.host))
    flags = f" SUSPECT:{','.join(verdict.flags)}" if verdict.flags else ""
    return ", ".join(parts) + f" {took}{flags}"


def _figure(value: float) -> str:
    """Three significant figures at most, never an exponent: 912, 95.1, 3.27."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
