"""The Backend interface and what backends share: start, observe and stop a service and k6."""

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from labrunner.model.engine_roles import Hosts
from labrunner.model.scenario import IDENTITY, USER_SHAPE, K6Instances, Profile, Scenario
from services.common import user_message

# The runner stops a service only after k6 has finished, so no client is left to move away
# while its health says NOT_SERVING: a drain would only lengthen every scenario. Nor is a call of
# the lab's left in flight, so the grace serves only calls whose client has gone: 1 s bounds what one
# of those may hold up the next scenario. (The stops that waited a whole 10 s grace now and then were
# the supervisor's missed exit, fixed: services/common/supervisor.py.)
SERVICE_STOP_ENV = {"SHUTDOWN_DRAIN_SECONDS": "0", "SHUTDOWN_GRACE_SECONDS": "1"}
LOG_TAIL_LINES = 30
_Number = TypeVar("_Number", int, float)


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
    hosts: Hosts = field(default_factory=Hosts)  # the docker backend's engine per role (local: the default)


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
    k6_cpus: tuple[int, ...]  # CPUs k6 may use (k6 on other engines: numbered places, see k6_places)
    notes: tuple[str, ...] = ()  # caveats that qualify this scenario's numbers
    # Network scenarios: the emulator and the link's measured RTT and rate (local backend).
    network: Mapping[str, Any] | None = None
    network_path: str = ""  # how k6's packets reach the service (loopback, a bridge, a veth pair)
    interpreter: Mapping[str, Any] | None = None  # the service's Python build, from its listening line
    # k6 on engines other than the service's: what each k6_cpus entry stands for ("engine B CPU 1").
    k6_places: tuple[str, ...] = ()


@dataclass(frozen=True)
class K6Invocation:
    """One k6 run, backend-independent: the backend decides where the binary runs."""

    script: Path
    args: tuple[str, ...]  # options placed between `k6 run` and the script
    env: Mapping[str, str]
    summary_file: Path  # where handleSummary writes its JSON (SUMMARY_FILE)
    log_file: Path  # k6 stdout and stderr
    # A k6 split into instances (k6_instances > 1): this invocation describes the whole run,
    # `instances` the processes that run it, each on its execution segment and its own CPUs.
    instances: tuple["K6Invocation", ...] = ()
    segment: str | None = None  # an instance's --execution-segment, e.g. "1/2:1"
    cpus: tuple[int, ...] | None = None  # an instance's CPUs; None: all of the k6 side's
    raw_file: Path | None = None  # an instance's --out csv file: every sample, for merged percentiles

    @property
    def run_args(self) -> tuple[str, ...]:
        """What follows the k6 binary: `run`, the options, the script."""
        return ("run", *self.args, str(self.script))

    @property
    def python_driven(self) -> bool:
        """Whether the Python driver (scripts/drive_http.py, labrunner.run.drive) runs it, not k6."""
        return self.script.suffix == ".py"

    def command(self, k6_binary: Path) -> tuple[str, ...]:
        """The process that runs it: k6 with run_args, or this interpreter on the driver with the options."""
        if self.python_driven:
            return (sys.executable, str(self.script), *self.args)
        return (str(k6_binary), *self.run_args)


@dataclass(frozen=True)
class K6Process:
    """How a k6 process ended and what it cost the load generator; the runner reads its summary."""

    exit_code: int
    wall_seconds: float
    cpu_seconds: float | None
    cpus: int  # CPUs k6 could use
    output_tail: str
    # CPU seconds a link emulator process (the userspace relay, on k6's CPUs) took during a
    # measured run: not k6's own time, so interference on k6's CPUs. None without one.
    relay_cpu_seconds: float | None = None
    placement: str | None = None  # where it ran when that is not this host ("engine B CPU 1")


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
    # cpu_seconds split into user and kernel (system) time, where the backend can tell.
    user_cpu_seconds: float | None = None
    system_cpu_seconds: float | None = None

    @classmethod
    def unmeasured(cls, exit_code: int | None, log_tail: str) -> "ServiceUsage":
        """A service stopped before any measured k6 run: how it ended, nothing else."""
        return cls(None, None, None, None, None, None, None, None, None, exit_code, log_tail)


class Backend(Protocol):
    """Steps 1 and 5 of a scenario and where k6 runs; the runner owns everything in between.

    Threads: stop_service runs on the session's finisher thread, while the main thread may be in
    start_service, run_k6 or the checks of the next scenario; every other method runs on the main
    thread, close() only once the finisher is done. So a backend guards what stop_service shares
    with the rest, and gives the finisher its own connections where a client is not thread-safe.
    Two scenarios' services may run side by side, each under its own limits and on its own port.
    """

    name: str

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        """Start the scenario's service under its profile's limits and wait for its listening line."""
        ...

    def service_ended(self, handle: ServiceHandle) -> str | None:
        """None while the service runs; else how it ended, e.g. "exited with code 1"."""
        ...

    def service_log_tail(self, handle: ServiceHandle) -> str:
        """The last lines of the service's output, for a failure's explanation."""
        ...

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        """Run k6 to completion; a measured run also opens the service's usage window."""
        ...

    def run_k6_instances(
        self, handle: ServiceHandle, invocations: Sequence[K6Invocation], measured: bool
    ) -> tuple[K6Process, ...]:
        """k6 split into instances (k6_instances > 1): start every instance together, each on its
        invocation's CPUs, and wait for all of them; a measured run's usage window spans them all."""
        ...

    def check_k6_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        """BackendUnavailable, naming the host or engines, when k6 split into k6_instances (one CPU
        each) does not fit where the load runs beside this profile; checked before the first scenario."""
        ...

    @property
    def cpus_elsewhere(self) -> str | None:
        """Why this host's /proc/stat does not hold the scenario's CPUs; None when it does."""
        ...

    def service_connections(self, handle: ServiceHandle) -> int | None:
        """The established TCP connections to the service's port, counted in its network namespace
        (backends.connections); None when this backend cannot read them."""
        ...

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        """Stop the service (graceful, then forced) and release its limits; always safe to call, on
        the finisher thread too."""
        ...

    def close(self) -> None:
        """Stop whatever is still running (after an error or Ctrl-C), a stop cut short included."""
        ...


def listening_event(lines: Iterable[bytes]) -> dict[str, Any]:
    """The service's JSON "listening" line (services/common/supervisor.py), {} before it is printed."""
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "listening":
            return event
    return {}


def service_env(scenario: Scenario) -> dict[str, str]:
    """What every backend sets for a scenario's service, besides where it listens and its TLS files."""
    return {
        "RESPONSE_MODEL": scenario.response_model,
        "SHAPE": scenario.shape,
        "COMPRESSION": scenario.compression,
        **shape_dir_env(scenario),
        **SERVICE_STOP_ENV,
        **dict(scenario.target.env),
    }


def shape_dir_env(scenario: Scenario) -> dict[str, str]:
    """SHAPE_DIR, the files of the user's own message (services.common.user_message), for its shape."""
    if scenario.shape != USER_SHAPE:
        return {}
    user = user_message.installed()
    if user is None:
        raise ScenarioFailed("start", f"shape {USER_SHAPE}: no message given (--proto, --message)")
    return {"SHAPE_DIR": str(user.directory)}


def check_listening(listening: Mapping[str, Any], scenario: Scenario, log_tail: str) -> None:
    """ScenarioFailed when the listening line does not describe the scenario's service."""
    target = scenario.target
    if (
        not isinstance(listening.get("port"), int)
        or bool(listening.get("tls")) != target.tls
        or listening.get("response_model") != scenario.response_model
        # A line without a shape (a service from before shapes) served cars; without a compression,
        # identity.
        or listening.get("shape", "cars") != scenario.shape
        or listening.get("compression", IDENTITY) != scenario.compression
        or bool(listening.get("http3")) != (target.protocol == "http3")
    ):
        expected = (
            f"target tls={target.tls}, response_model={scenario.response_model}, shape={scenario.shape}, "
            f"compression={scenario.compression}"
        )
        raise ScenarioFailed(
            "start", f"unexpected listening line {json.dumps(listening)} ({expected})", log_tail
        )


def check_profile_fits(profile: Profile, cpus: int, have: str) -> None:
    """Refuse a profile that asks for more CPUs than there are: its limit would not bind, and the
    engine or the kernel would reject it or quietly give less. have: "the host has 2"."""
    if profile.cpus > cpus:
        raise ScenarioFailed("start", f"profile {profile.name} asks for {profile.cpus:g} CPUs; {have}")


def k6_instances_problem(count: K6Instances, k6_cpus: int, where: str) -> str | None:
    """Why `count` k6 instances, one CPU each, do not fit on k6_cpus CPUs; None when they do (or "auto")."""
    if isinstance(count, str) or count <= k6_cpus:
        return None
    return (
        f"k6_instances = {count} needs {count} CPUs for k6, one per instance; {where}, so k6 has "
        f"{k6_cpus}: lower --k6-instances, use 'auto', or give the load more CPUs"
    )


def shared_cpus_note(k6_cpus: Sequence[int], have: str, profile: Profile) -> str:
    """The caveat on a scenario whose k6 runs on the service's CPUs; have: "the host has 2 CPUs"."""
    return (
        f"k6 shares CPUs {cpu_list(k6_cpus)} with the service: {have} and the {profile.name} "
        f"profile needs {profile.whole_cpus}"
    )


def tail(output: bytes, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a process's output, as text."""
    return "\n".join(output.decode(errors="replace").splitlines()[-lines:])


def tail_file(path: Path, offset: int = 0) -> str:
    """The last lines written to a log file after offset; "" when it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return tail(f.read())
    except OSError:
        return ""


def delta(before: _Number | None, after: _Number | None) -> _Number | None:
    """after - before, None when either counter is unknown."""
    return None if before is None or after is None else after - before


def cpu_list(cpus: Sequence[int]) -> str:
    """CPUs as cpuset and taskset write them: "0,1"."""
    return ",".join(map(str, cpus))
