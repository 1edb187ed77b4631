"""Host interference: the CPU time processes outside a scenario took on its CPUs, and steal.

Per-CPU counters from /proc/stat are read right before and right after each measured k6
run, each read timestamped. Over that window, on the service's CPUs and on k6's CPUs:

- capacity = the window's wall time x the number of CPUs;
- steal = time the hypervisor gave these virtual CPUs' slots to other guests;
- busy = capacity - idle - iowait - steal: the time the CPUs ran something;
- others = busy - the scenario's own CPU time (the service's cgroup, k6's rusage).

The userspace link emulator (a relay process on k6's CPUs, network scenarios only) is not the
scenario's own time: it is interference on k6's CPUs, inside others, and reported apart
("of which relay": relay_cpu_seconds and relay_share in the k6 CPUs' figure). So is the CPU time of
the Prometheus and InfluxDB the run started, pinned to k6's side (observe.lab_cpu): "of which lab",
lab_cpu_seconds and lab_share.

Busy is not user + nice + system + irq + softirq: the kernel charges those a whole tick to
whatever runs when the tick fires, which misses much of the short, timer-driven bursts a server
and k6 run in. Idle and iowait are timed exactly on a tickless (NO_HZ) kernel, steal comes from
the hypervisor's clock, and the scenario's own figures are exact; /proc/stat prints 10 ms units,
so others may come out slightly negative. How exact it is, measured: docs/measurement.md.
"""

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from labrunner.backends.base import (
    Backend,
    K6Invocation,
    K6Process,
    ServiceHandle,
    ServiceUsage,
    cpu_list,
)
from labrunner.model.scenario import K6Instances, Profile, Scenario
from labrunner.observe import lab_cpu, steal_clock

PROC_STAT = Path("/proc/stat")
USER_HZ = os.sysconf("SC_CLK_TCK")
# How far others may come out negative from the counters' resolution alone (see above).
MEASUREMENT_ERROR_SHARE = 0.01
# /proc/stat columns after "cpuN", in order (proc(5)).
_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's cumulative /proc/stat counters that interference is computed from, in seconds."""

    idle: float  # idle + iowait
    steal: float


@dataclass(frozen=True)
class Snapshot:
    """/proc/stat's per-CPU counters and when they were read (time.monotonic())."""

    at: float
    cpus: Mapping[int, CpuTimes]


Reader = Callable[[], Snapshot]
# The speed reference's counters (run.speed_reference): units done, and the CPU nanoseconds they took;
# None while it does not run.
ReferenceReader = Callable[[], tuple[int, int] | None]


@dataclass(frozen=True)
class Window:
    """/proc/stat around one measured k6 run, and the CPU seconds k6 used in it."""

    before: Snapshot
    after: Snapshot
    k6_cpu_seconds: float | None
    # The userspace link emulator's CPU time in the window: on k6's CPUs, part of "others" there.
    relay_cpu_seconds: float | None = None
    # Whether own CPU times include time stolen from them (observe.steal); None: unknown.
    includes_steal: bool | None = None
    # The lab's own daemons' CPU time in the window (pinned to k6's side): part of "others" there.
    lab_cpu_seconds: float | None = None
    # The speed reference in the window (run.speed_reference), on the service's CPUs: the lab's own there.
    reference_units: int | None = None
    reference_cpu_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return self.after.at - self.before.at


def parse_proc_stat(text: str, ticks_per_second: int = USER_HZ) -> dict[int, CpuTimes]:
    """The per-CPU lines of /proc/stat ("cpu0 ...", not the "cpu" total) as CpuTimes."""
    cpus = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        values = dict(zip(_COLUMNS, (int(v) for v in rest.split()), strict=False))
        cpus[int(name[3:])] = CpuTimes(
            idle=(values["idle"] + values.get("iowait", 0)) / ticks_per_second,
            steal=values.get("steal", 0) / ticks_per_second,  # old kernels: fewer columns
        )
    return cpus


def read_snapshot(path: Path = PROC_STAT) -> Snapshot:
    """/proc/stat now, stamped with the middle of the read."""
    began = time.monotonic()
    text = path.read_text()
    return Snapshot((began + time.monotonic()) / 2, parse_proc_stat(text))


def others_share(before: Snapshot, after: Snapshot, own_cpu_seconds: float) -> float:
    """The share of all the host's CPUs that processes other than ours used between two snapshots."""
    cpus = [cpu for cpu in before.cpus if cpu in after.cpus]
    window = Window(before, after, None)
    capacity = window.seconds * len(cpus)
    if capacity <= 0:
        return 0.0
    busy = capacity - _delta(window, cpus, "idle") - _delta(window, cpus, "steal")
    return max(0.0, busy - own_cpu_seconds) / capacity


def unavailable(backend: Backend, proc_stat: Path = PROC_STAT) -> str | None:
    """Why this host's /proc/stat cannot describe the scenario's CPUs; None when it can."""
    if elsewhere := backend.cpus_elsewhere:
        return elsewhere
    if not os.access(proc_stat, os.R_OK):
        return f"{proc_stat} cannot be read on this host"
    return None


def interference(
    window: Window | None,
    service_cpus: Sequence[int],
    k6_cpus: Sequence[int],
    service_cpu_seconds: float | None,
    reason: str | None = None,
) -> dict[str, Any]:
    """The result's "host" section: what others and the hypervisor took over the window.

    When the two CPU sets overlap, the union is one figure, from which the service's and
    k6's own time are both subtracted once; it then stands for both sets.
    """
    if window is None or reason is not None:
        return _unknown(reason or "no measured k6 run")
    union = sorted(set(service_cpus) | set(k6_cpus))
    missing = [cpu for cpu in union if cpu not in window.before.cpus or cpu not in window.after.cpus]
    if missing:
        return _unknown(f"CPU(s) {cpu_list(missing)} not in /proc/stat")
    steal, capacity = _delta(window, union, "steal"), window.seconds * len(union)
    section: dict[str, Any] = {
        "measured": True,
        "reason": None,
        "window_seconds": _round(window.seconds),
        "interference": None,
        "steal_seconds": _round(steal),
        "steal_share": _round(steal / capacity) if capacity > 0 else None,
        "speed_reference": _speed_reference(window),
    }
    if window.reference_cpu_seconds is not None:  # on the service's CPUs, the lab's own: not others'
        service_cpu_seconds = _sum(service_cpu_seconds, window.reference_cpu_seconds)
    if set(service_cpus) & set(k6_cpus):
        own = _sum(service_cpu_seconds, window.k6_cpu_seconds)
        shared = _cpus_figure(window, union, own, window.relay_cpu_seconds, window.lab_cpu_seconds)
        section["interference"] = {"service_cpus": shared, "k6_cpus": shared, "shared": True}
    else:
        section["interference"] = {
            "service_cpus": _cpus_figure(window, service_cpus, service_cpu_seconds),
            "k6_cpus": _cpus_figure(
                window, k6_cpus, window.k6_cpu_seconds, window.relay_cpu_seconds, window.lab_cpu_seconds
            ),
            "shared": False,
        }
    return section


def scenario_section(
    window: Window | None,
    handle: ServiceHandle | None,
    usage: ServiceUsage | None,
    reason: str | None,
    beside: tuple[float | None, float | None] | None = None,
) -> dict[str, Any] | None:
    """interference() for a scenario; None when no service ran.

    beside: a duet partner's service and k6 CPU seconds over the same window, which ran on the same
    CPUs as part of the measurement: counted as the scenario's own, not as others'."""
    if handle is None:
        return None
    service_cpu_seconds = usage.cpu_seconds if usage else None
    if beside is not None and window is not None:
        partner_service, partner_k6 = beside
        service_cpu_seconds = _sum(service_cpu_seconds, partner_service)
        window = replace(window, k6_cpu_seconds=_sum(window.k6_cpu_seconds, partner_k6))
    return interference(window, handle.service_cpus, handle.k6_cpus, service_cpu_seconds, reason)


def describe(section: Mapping[str, Any] | None) -> str:
    """The progress line's figure, short: "others 0.8/2.1%" (service's/k6's CPUs) or "others 10.0%
    shared"; "others n/a" when not measured. The relay's part and steal are in summary.md (and
    flagged on the line when they make the result suspect)."""
    if not section or not section.get("measured"):
        return "others n/a"
    figures = section.get("interference") or {}
    if figures.get("shared"):
        return f"others {_percent(figures['service_cpus'].get('share'))} shared"
    service = _percent((figures.get("service_cpus") or {}).get("share")).removesuffix("%")
    return f"others {service}/{_percent((figures.get('k6_cpus') or {}).get('share'))}"


def relay_share(section: Mapping[str, Any] | None) -> float | None:
    """The share of k6's CPUs the userspace link emulator took (inside others there); None without one."""
    figures = ((section or {}).get("interference") or {}).get("k6_cpus") or {}
    value = figures.get("relay_share")
    return None if value is None else float(value)


def lab_share(section: Mapping[str, Any] | None) -> float | None:
    """The share of k6's CPUs the run's own Prometheus and InfluxDB took (inside others there); None
    when the run started none."""
    figures = ((section or {}).get("interference") or {}).get("k6_cpus") or {}
    value = figures.get("lab_share")
    return None if value is None else float(value)


def share(section: Mapping[str, Any] | None, key: str) -> float | None:
    """A result's others share on "service_cpus" or "k6_cpus"; None when unknown."""
    figures = ((section or {}).get("interference") or {}).get(key) or {}
    value = figures.get("share")
    return None if value is None else float(value)


@dataclass(frozen=True)
class _Opened:
    """What a window's edge reads: /proc/stat, the lab's daemons' CPU seconds, the speed reference."""

    snapshot: Snapshot
    lab_cpu_seconds: float | None
    reference: tuple[int, int] | None


class MeteredBackend:
    """A backend whose measured k6 runs are bracketed by /proc/stat reads; `window` is the last.

    The last measured run is also the window the backend's ServiceUsage covers (a capacity
    search's last step), so the scenario's own CPU time and /proc/stat agree on the window.
    """

    def __init__(
        self,
        backend: Backend,
        read: Reader | None,
        lab_pids: Sequence[int] = (),
        reference: ReferenceReader | None = None,
    ) -> None:
        self.name = backend.name
        self._backend = backend
        self._read = read
        self._lab_pids = tuple(lab_pids)
        self._reference = reference
        self._includes_steal = steal_clock.this_kernel().includes_steal
        self.window: Window | None = None
        # The last measured run's userspace link emulator CPU seconds, /proc/stat or not.
        self.relay_cpu_seconds: float | None = None

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        return self._backend.start_service(scenario)

    def service_ended(self, handle: ServiceHandle) -> str | None:
        return self._backend.service_ended(handle)

    def service_log_tail(self, handle: ServiceHandle) -> str:
        return self._backend.service_log_tail(handle)

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        if not measured or self._read is None:
            process = self._backend.run_k6(handle, invocation, measured)
        else:
            opened = self._open(self._read)
            process = self._backend.run_k6(handle, invocation, measured)
            self.window = self._window(self._read, opened, process.cpu_seconds, process.relay_cpu_seconds)
        if measured:
            self.relay_cpu_seconds = process.relay_cpu_seconds
        return process

    def run_k6_instances(
        self, handle: ServiceHandle, invocations: Sequence[K6Invocation], measured: bool
    ) -> tuple[K6Process, ...]:
        """k6 split into instances: one window around all of them, k6's time their sum."""
        backend = self._backend
        if not measured or self._read is None:
            processes = backend.run_k6_instances(handle, invocations, measured)
        else:
            opened = self._open(self._read)
            processes = backend.run_k6_instances(handle, invocations, measured)
            k6_cpu_seconds = _sum(*(p.cpu_seconds for p in processes))
            relay = processes[0].relay_cpu_seconds if processes else None
            self.window = self._window(self._read, opened, k6_cpu_seconds, relay)
        if measured:
            self.relay_cpu_seconds = processes[0].relay_cpu_seconds if processes else None
        return processes

    def _lab_cpu(self) -> float | None:
        return lab_cpu.cpu_seconds(self._lab_pids) if self._lab_pids else None

    def _open(self, read: Reader) -> _Opened:
        return _Opened(read(), self._lab_cpu(), self._reference() if self._reference is not None else None)

    def _window(
        self, read: Reader, opened: _Opened, k6_cpu_seconds: float | None, relay_cpu_seconds: float | None
    ) -> Window:
        """The window from `opened` to now (read the moment k6 ended)."""
        closed = self._open(read)
        units = cpu_seconds = None
        if opened.reference is not None and closed.reference is not None:
            units = closed.reference[0] - opened.reference[0]
            cpu_seconds = (closed.reference[1] - opened.reference[1]) / 1e9
        return Window(
            opened.snapshot,
            closed.snapshot,
            k6_cpu_seconds,
            relay_cpu_seconds,
            self._includes_steal,
            _difference(closed.lab_cpu_seconds, opened.lab_cpu_seconds),
            units,
            cpu_seconds,
        )

    def check_k6_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        self._backend.check_k6_instances(profile, k6_instances)

    @property
    def cpus_elsewhere(self) -> str | None:
        return self._backend.cpus_elsewhere

    def service_connections(self, handle: ServiceHandle) -> int | None:
        return self._backend.service_connections(handle)

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        return self._backend.stop_service(handle)

    def close(self) -> None:
        self._backend.close()


def _cpus_figure(
    window: Window,
    cpus: Iterable[int],
    own_cpu_seconds: float | None,
    relay_cpu_seconds: float | None = None,
    lab_cpu_seconds: float | None = None,
) -> dict[str, Any]:
    """relay_cpu_seconds, lab_cpu_seconds: the link emulator's and the lab's daemons' share of
    others, reported apart ("of which relay", "of which lab")."""
    cpus = sorted(cpus)
    capacity, idle, steal = (
        window.seconds * len(cpus),
        _delta(window, cpus, "idle"),
        _delta(window, cpus, "steal"),
    )
    busy = capacity - idle - steal
    others, steal_in_own = _others(busy, steal, capacity, own_cpu_seconds, window.includes_steal)
    figure = {
        "cpus": cpus,
        "capacity_cpu_seconds": _round(capacity),
        "idle_cpu_seconds": _round(idle),
        "busy_cpu_seconds": _round(busy),
        "own_cpu_seconds": _round(own_cpu_seconds),
        "others_cpu_seconds": _round(others),
        "share": _round(others / capacity) if others is not None and capacity > 0 else None,
        "steal_in_own_time": steal_in_own,
    }
    if relay_cpu_seconds is not None:
        figure["relay_cpu_seconds"] = _round(relay_cpu_seconds)
        figure["relay_share"] = _round(relay_cpu_seconds / capacity) if capacity > 0 else None
    if lab_cpu_seconds is not None:
        figure["lab_cpu_seconds"] = _round(lab_cpu_seconds)
        figure["lab_share"] = _round(lab_cpu_seconds / capacity) if capacity > 0 else None
    return figure


def _speed_reference(window: Window) -> dict[str, Any] | None:
    """The speed reference's units and CPU seconds in the window (run.speed_reference); None without one."""
    if not window.reference_units or window.reference_cpu_seconds is None:
        return None
    return {
        "units": window.reference_units,
        "cpu_seconds": round(window.reference_cpu_seconds, 6),
        "seconds_per_unit": window.reference_cpu_seconds / window.reference_units,
    }


def _others(
    busy: float, steal: float, capacity: float, own: float | None, includes_steal: bool | None
) -> tuple[float | None, str | None]:
    """Others' CPU seconds, and why stolen time was taken to be inside the scenario's own time (or None).

    When the task clock runs while the CPU is stolen, own time holds its part of the steal:
    busy + steal is what all tasks were charged, others' charge is what own leaves of it, and
    steal is apportioned to others as to everyone, by their charge. A window whose own time exceeds
    busy by more than the measurement error shows that, whatever the kernel's configuration says.
    """
    if own is None:
        return None, None
    excluded = busy - own
    charged = busy + steal
    if steal <= 0 or charged <= 0:
        return excluded, None
    included = (charged - own) * busy / charged
    if includes_steal:
        return included, "the kernel's task clock counts steal"
    if excluded < -MEASUREMENT_ERROR_SHARE * capacity:
        return included, "observed: own CPU time exceeded the CPUs' busy time"
    return excluded, None


def _unknown(reason: str) -> dict[str, Any]:
    return {
        "measured": False,
        "reason": reason,
        "window_seconds": None,
        "interference": None,
        "steal_seconds": None,
        "steal_share": None,
    }


def _delta(window: Window, cpus: Iterable[int], field: str) -> float:
    return sum(
        float(getattr(window.after.cpus[c], field)) - float(getattr(window.before.cpus[c], field))
        for c in cpus
    )


def _difference(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _sum(*values: float | None) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _percent(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"
