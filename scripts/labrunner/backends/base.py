"""The Backend interface: how a scenario's service is started, loaded by k6, stopped and measured."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labrunner.model.matrix import Scenario

# The runner stops a service only after k6 has finished, so no client is left to move away
# while its health says NOT_SERVING: a drain would only lengthen every scenario.
SERVICE_STOP_ENV = {"SHUTDOWN_DRAIN_SECONDS": "0"}


class ScenarioFailed(Exception):
    """One scenario cannot go on; the run records it and continues with the next."""

    def __init__(self, phase: str, message: str, log_tail: str = "") -> None:
        super().__init__(f"{phase}: {message}")
        self.phase = phase
        self.message = message
        self.log_tail = log_tail


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BackendSettings:
    """What every backend needs to know about the run, fixed for its whole length."""

    run_id: str
    root: Path  # repository root: services/, k6/, proto/
    certs_dir: Path
    logs_dir: Path
    k6_binary: Path
    start_timeout_s: float
    stop_timeout_s: float


@dataclass(frozen=True)
class ServiceHandle:
    """A running system under test and how each party reaches it."""

    scenario_id: str
    service: str
    address: Endpoint  # from the runner: health checks and verification
    k6_address: Endpoint  # from k6 (a compose host name under docker)
    metrics_address: Endpoint | None  # /metrics from the runner; None when metrics are off
    prometheus_target: str | None  # host:port as Prometheus scrapes it
    workers: int | None
    limits: str  # how the profile is enforced: cgroup-v1, cgroup-v2, docker, affinity
    service_cpus: tuple[int, ...]  # CPUs the service is pinned to
    k6_cpus: tuple[int, ...]  # CPUs k6 may use
    notes: tuple[str, ...] = ()  # caveats that qualify this scenario's numbers


@dataclass(frozen=True)
class K6Invocation:
    """One k6 run, backend-independent: the backend decides where the binary runs."""

    script: Path
    args: tuple[str, ...]  # options placed between `k6 run` and the script
    env: Mapping[str, str]
    summary_file: Path  # where handleSummary writes its JSON (SUMMARY_FILE)
    log_file: Path  # k6 stdout and stderr


@dataclass(frozen=True)
class K6Run:
    """What a k6 run returned and what it cost the load generator."""

    exit_code: int
    summary: Mapping[str, Any] | None  # handleSummary JSON; None when k6 wrote none
    wall_seconds: float
    cpu_seconds: float | None
    cpus: int  # CPUs k6 could use
    output_tail: str

    @property
    def cpu_utilisation(self) -> float | None:
        """k6's CPU use as a fraction of the CPUs it may use; near 1.0 means k6 saturated."""
        if self.cpu_seconds is None or self.wall_seconds <= 0 or self.cpus <= 0:
            return None
        return self.cpu_seconds / (self.wall_seconds * self.cpus)


@dataclass(frozen=True)
class ServiceUsage:
    """The service's resource use over the measured k6 run, and how it ended."""

    window_seconds: float | None  # None when no measured run took place
    cpu_seconds: float | None
    cpu_limit_cores: float | None
    cpu_periods: int | None
    throttled_periods: int | None
    throttled_seconds: float | None
    memory_peak_bytes: int | None
    memory_peak_scope: str | None  # "window" when reset before measuring, else "lifetime"
    memory_limit_bytes: int | None
    exit_code: int | None
    log_tail: str


class Backend(Protocol):
    """Steps 1 and 5 of a scenario and where k6 runs; everything else is shared code."""

    name: str

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        """Start the scenario's service under its profile's limits; ScenarioFailed if it cannot."""
        ...

    def wait_healthy(self, handle: ServiceHandle) -> None:
        """Return once the service reports SERVING; ScenarioFailed with its log on timeout."""
        ...

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Run:
        """Run k6 to completion; a measured run also opens the service's usage window."""
        ...

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        """Stop the service (graceful, then forced) and release its limits; always safe to call."""
        ...

    def close(self) -> None:
        """Stop whatever is still running (after an error or Ctrl-C)."""
        ...
