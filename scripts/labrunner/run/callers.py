"""Preset caller's measurements: a Python caller, the lab's (labrunner.callers) or its floor
(benchmarks/callers), run in a cgroup of its own at the scenario's profile, calling a lab server that
has a CPU of its own (docs/caller.md).

A caller scenario is a matrix scenario read from the caller's side: its target is the server called (a
protocol has one Python client here, CLIENTS), its profile the caller's budget, its closed load model's
VUs the calls in flight, its count and direction the call. Each is measured twice, by the lab's caller
and by its floor. The caller starts at a whole CPU (importing and loading the pool are no part of what
the profile limits) and gets the profile's quota once it has verified its call; the runner reads its
lines (services.common.caller_loop) and samples, at the measured window's two ends, the server's CPU
from its /metrics and /proc/stat for what else ran on the caller's CPUs.
"""

import contextlib
import ctypes
import functools
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labrunner import interrupts
from labrunner.backends.base import ServiceHandle, tail_file
from labrunner.backends.cgroups import Cgroup, create_cgroup, join_cgroup, remove_cgroup, set_cpu_quota
from labrunner.model.scenario import Plan, Profile, Scenario
from labrunner.observe.interference import Snapshot, read_snapshot
from labrunner.paths import REPO
from labrunner.run.capacity import service_cpu
from services.common import caller_loop
from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.records import checksum, load_pool, record_from_json

# The Python client of each protocol: its module under each variant's package.
CLIENTS = {"http1.1": "aiohttp_h1", "http2": "httpx_h2", "grpc": "grpc_aio"}
LAB, FLOOR = "lab", "floor"
VARIANTS = {LAB: "labrunner.callers", FLOOR: "benchmarks.callers"}
# The server called: a quota of a whole CPU, pinned to a CPU the caller does not run on (the local
# backend pins a one-CPU service to the highest CPU and leaves the rest to the load side).
SERVER_PROFILE = Profile("server", 1.0, 1 << 30)
STOP_GRACE_S = 5.0
_DECIDED = ("CALLER_", "RECORD_POOL_SIZE", "RECORD_SEED")  # inherited, they would make runs irreproducible
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up once here: a child between fork and exec must not dlopen.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclass(frozen=True)
class Measurement:
    """One caller (lab or floor) calling a scenario's target under the scenario's profile, count,
    direction, calls in flight (its closed model's VUs), warm-up and window."""

    scenario: Scenario
    variant: str  # LAB or FLOOR

    @property
    def client(self) -> str:
        return CLIENTS[self.scenario.target.protocol]

    @property
    def module(self) -> str:
        return f"{VARIANTS[self.variant]}.{self.client}"

    @property
    def group(self) -> str:
        """The id without the repeat: <target>.<variant>.<profile>.c<count>.<direction>."""
        s = self.scenario
        return f"{s.target.name}.{self.variant}.{s.profile.name}.c{s.count}.{s.direction}"

    @property
    def id(self) -> str:
        return f"{self.group}.r{self.scenario.repeat}"

    @property
    def concurrency(self) -> int:
        return self.scenario.load_model.vus or 1


def measurements(plan: Plan) -> tuple[Measurement, ...]:
    """Each scenario of a caller plan measured by the lab's caller, then by its floor; ValueError naming
    what a caller cannot be: a target whose protocol has no Python client, a model with no fixed VUs."""
    for scenario in plan.scenarios:
        if scenario.target.protocol not in CLIENTS:
            raise ValueError(
                f"target {scenario.target.name}: no Python caller speaks {scenario.target.protocol}"
            )
        if scenario.load_model.executor != "constant-vus":
            raise ValueError(
                f"load model {scenario.load_model.name}: a caller keeps a fixed number of calls in flight "
                "(executor constant-vus)"
            )
    return tuple(Measurement(s, variant) for s in plan.scenarios for variant in VARIANTS)


def run_order(planned: Sequence[Measurement], seed: int) -> list[Measurement]:
    """The rounds in order (a round: one repeat of every measurement), each shuffled by the seed."""
    shuffler = random.Random(seed)
    ordered: list[Measurement] = []
    for repeat in sorted({m.scenario.repeat for m in planned}):
        members = [m for m in planned if m.scenario.repeat == repeat]
        shuffler.shuffle(members)
        ordered += members
    return ordered


def server_scenario(scenario: Scenario) -> Scenario:
    """The scenario the backend starts a caller scenario's server from: its target and response model on
    SERVER_PROFILE, one per target (whatever the count, direction or repeat)."""
    return Scenario(
        target=scenario.target,
        profile=SERVER_PROFILE,
        count=scenario.count,
        load_model=scenario.load_model,
        duration_s=scenario.duration_s,
        warmup_s=scenario.warmup_s,
        repeat=1,
        repeats=1,
        response_model=scenario.response_model,
    )


@dataclass(frozen=True)
class CallerOutcome:
    """How one measurement went: the caller's lines, the server's CPU and what else ran on the caller's
    CPUs over its window, and how the caller ended."""

    measurement: Measurement
    caller_cpus: tuple[int, ...]
    ready: dict[str, Any] | None = None  # EVENT_READY: what the verification found
    measured: dict[str, Any] | None = None  # EVENT_MEASURED: the window's figures
    error: str | None = None  # why the measurement failed
    server_cpu_seconds: float | None = None
    server_cpu_limit: float | None = None
    # /proc/stat on the caller's CPUs at the window's ends (runner's clock).
    host_before: Snapshot | None = field(default=None, repr=False)
    host_after: Snapshot | None = field(default=None, repr=False)
    exit_code: int | None = None
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.measured is not None


def pool_checksum(count: int) -> int:
    """checksum() of the first `count` records of the pool every caller and server holds: what each
    caller's verification must find, computed apart from the callers' own mapping of the pool."""
    pool = load_pool(DEFAULT_POOL_SIZE, DEFAULT_SEED)[:count]
    return checksum(record_from_json(record) for record in pool)


def caller_env(measurement: Measurement, handle: ServiceHandle, ca_file: Path | None) -> dict[str, str]:
    """The caller's environment: this one's, without the settings the runner decides, then its settings
    (services.common.caller_loop); the pool's variables left unset, as for the server."""
    s = measurement.scenario
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DECIDED)}
    env |= {
        "CALLER_ADDRESS": str(handle.address),
        "CALLER_DIRECTION": s.direction,
        "CALLER_COUNT": str(s.count),
        "CALLER_CONCURRENCY": str(measurement.concurrency),
        "CALLER_WARMUP_SECONDS": f"{s.warmup_s:g}",
        "CALLER_DURATION_SECONDS": f"{s.duration_s:g}",
        "PYTHONUNBUFFERED": "1",
    }
    if s.target.tls and ca_file is not None:
        env["CALLER_CA_FILE"] = str(ca_file)
    return env


def run_caller(
    measurement: Measurement,
    handle: ServiceHandle,
    *,
    run_id: str,
    ca_file: Path | None,
    log_file: Path,
    start_timeout_s: float,
) -> CallerOutcome:
    """Measure one caller against a running server; never raises for the caller's own failure."""
    profile = measurement.scenario.profile
    cpus = handle.k6_cpus
    cgroup = create_cgroup(f"{run_id}-{measurement.id}", profile.whole_cpus, profile.memory_bytes)
    try:
        with interrupts.held():  # a Ctrl-C inside Popen would leave the caller running, unknown
            process = _spawn(
                measurement, handle, ca_file=ca_file, log_file=log_file, cgroup=cgroup, cpus=cpus
            )
        try:
            outcome = _follow(
                measurement, process, handle, cgroup=cgroup, cpus=cpus, start_timeout_s=start_timeout_s
            )
        finally:
            _stop(process)
        exit_code = process.returncode
        error = outcome.error or (f"the caller exited with code {exit_code}" if exit_code else None)
        return replace(outcome, error=error, exit_code=exit_code, log_tail=tail_file(log_file))
    finally:
        remove_cgroup(cgroup)


def _spawn(
    measurement: Measurement,
    handle: ServiceHandle,
    *,
    ca_file: Path | None,
    log_file: Path,
    cgroup: Cgroup,
    cpus: tuple[int, ...],
) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", measurement.module],
            cwd=REPO,
            env=caller_env(measurement, handle, ca_file),
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            preexec_fn=functools.partial(_enter_limits, cgroup, cpus),  # noqa: PLW1509
        )


def _enter_limits(cgroup: Cgroup, cpus: tuple[int, ...]) -> None:
    """Runs in the caller between fork and exec (system calls only): its cgroup, its CPUs, and an end
    once the runner is gone."""
    join_cgroup(cgroup)
    os.sched_setaffinity(0, cpus)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _follow(
    measurement: Measurement,
    process: subprocess.Popen[bytes],
    handle: ServiceHandle,
    *,
    cgroup: Cgroup,
    cpus: tuple[int, ...],
    start_timeout_s: float,
) -> CallerOutcome:
    """Read the caller's lines until it has measured, failed, ended or overrun its time; act on each."""
    s = measurement.scenario
    deadline = time.monotonic() + start_timeout_s + s.warmup_s + s.duration_s
    found: dict[str, Any] = {"measurement": measurement, "caller_cpus": cpus}
    server_before: tuple[float, float] | None = None  # (CPU seconds, limit in cores)
    for event in _events(process, deadline):
        name = event.get("event")
        if name == caller_loop.EVENT_READY:
            set_cpu_quota(cgroup, s.profile.cpus)
            found["ready"] = event
        elif name == caller_loop.EVENT_WINDOW_START:
            server_before, found["host_before"] = service_cpu(handle), _snapshot(cpus)
        elif name == caller_loop.EVENT_WINDOW_END:
            server_after, found["host_after"] = service_cpu(handle), _snapshot(cpus)
            if server_before is not None and server_after is not None:
                found["server_cpu_seconds"] = server_after[0] - server_before[0]
                found["server_cpu_limit"] = server_after[1]
        elif name == caller_loop.EVENT_MEASURED:
            found["measured"] = event
            return CallerOutcome(**found)
        elif name == caller_loop.EVENT_FAILED:
            return CallerOutcome(**found, error=f"the caller failed: {event.get('error')}")
    ended = process.poll()
    why = f"the caller exited with code {ended}" if ended is not None else "the caller overran its time"
    return CallerOutcome(**found, error=f"{why} before measuring")


def _events(process: subprocess.Popen[bytes], deadline: float) -> Iterator[dict[str, Any]]:
    """The caller's JSON lines as they come, until its stdout closes or the deadline passes."""
    assert process.stdout is not None
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([process.stdout], [], [], left)
        if not readable:
            return
        line = process.stdout.readline()
        if not line:
            return
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                yield event


def _snapshot(cpus: Sequence[int]) -> Snapshot:
    """/proc/stat's counters of the caller's CPUs only."""
    snapshot = read_snapshot()
    return Snapshot(snapshot.at, {cpu: snapshot.cpus[cpu] for cpu in cpus if cpu in snapshot.cpus})


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Wait for the caller to end after its last line; SIGKILL its session when it does not in time."""
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if process.stdout is not None:
        process.stdout.close()
