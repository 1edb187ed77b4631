"""What one scenario produced, as typed objects: the result file and the verdict are made from it."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from labrunner.backends.base import ScenarioFailed, ServiceHandle, ServiceUsage
from labrunner.model.scenario import Scenario
from labrunner.run import capacity
from labrunner.run.k6.result import K6Run

if TYPE_CHECKING:  # service_checks imports the generated gRPC stubs; reading results does not need them
    from labrunner.run.service_checks import Verification


@dataclass(frozen=True)
class ScenarioOutcome:
    """Everything one scenario produced, from start to collect."""

    run_id: str
    backend: str
    scenario: Scenario
    started_at: datetime
    finished_at: datetime
    failure: ScenarioFailed | None
    handle: ServiceHandle | None
    verification: "Verification | None"
    k6_run: K6Run | None
    usage: ServiceUsage | None
    timings_s: Mapping[str, float]  # per phase, with "overhead" and "total"
    host: Mapping[str, Any] | None = None  # interference.interference(): others on the scenario's CPUs
    relay_cpu_seconds: float | None = None  # the userspace link emulator, on k6's CPUs
    search: capacity.Outcome | None = None  # a capacity search's steps
    # The connections from k6 the service held in each k6 run ("warmup", "measured window"): Watch.held
    connections_seen: Mapping[str, int | None] = field(default_factory=dict)

    @property
    def service_cpu_utilisation(self) -> float | None:
        """The service's CPU time over its quota during k6's load time."""
        usage = self.usage
        if usage is None or usage.cpu_seconds is None or not usage.cpu_limit_cores:
            return None
        metrics = self.k6_run.metrics if self.k6_run else None
        # The service idles while k6 starts up, so k6's load time is the fairer denominator.
        seconds = (metrics.test_run_seconds if metrics else None) or usage.window_seconds
        if not seconds:
            return None
        return usage.cpu_seconds / (usage.cpu_limit_cores * seconds)
