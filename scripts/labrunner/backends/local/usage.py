"""What the local backend accounts: a child's CPU seconds from wait4, the service's CPU and memory
from its cgroup (or, without one, its session's /proc stats), and the measured window as the
service's usage."""

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labrunner.backends.base import ServiceUsage, delta
from labrunner.backends.cgroups import Cgroup
from services.common.cgroup import CgroupStats, read_stats

_K6_POLL_S = 0.01  # how often split k6 instances are checked for their end
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Window:
    """The service's stats at the measured window's start and end."""

    before: CgroupStats
    after: CgroupStats
    wall_seconds: float
    memory_peak_scope: str


def wait_with_usage(process: subprocess.Popen[bytes]) -> float:
    """Wait for the child and return its CPU seconds (user + system) from wait4."""
    _, status, usage = os.wait4(process.pid, 0)
    # wait4 reaped the child, so Popen must be told its exit code.
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def wait_all_with_usage(processes: Sequence[subprocess.Popen[bytes]]) -> list[tuple[float, float]]:
    """Wait for every child; per child its CPU seconds (wait4) and when it ended (monotonic).

    Polled, so each instance's end is its own: a blocking wait on one would date the others late.
    """
    pending = {process.pid: process for process in processes}
    ended: dict[int, tuple[float, float]] = {}
    while pending:
        for pid, process in list(pending.items()):
            reaped, status, usage = os.wait4(pid, os.WNOHANG)
            if reaped:
                process.returncode = os.waitstatus_to_exitcode(status)
                ended[pid] = (usage.ru_utime + usage.ru_stime, time.monotonic())
                del pending[pid]
        if pending:
            time.sleep(_K6_POLL_S)
    return [ended[process.pid] for process in processes]


def sample(cgroup: Cgroup | None, session_id: int, pinned_cpus: int) -> CgroupStats:
    """The service's stats now: its cgroup's, else its session's processes'."""
    if cgroup is not None:
        return read_stats(cgroup.paths)
    return session_stats(session_id, pinned_cpus)


def session_stats(session_id: int, pinned_cpus: int) -> CgroupStats:
    """CPU seconds of every process in the service's session, for when no cgroup exists."""
    user_ticks = system_ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # Fields after the command name: state ppid pgrp session ... utime(12) stime(13).
        if int(fields[3]) == session_id:
            user_ticks += int(fields[11])
            system_ticks += int(fields[12])
    return CgroupStats(
        cpu_usage_seconds=(user_ticks + system_ticks) / _CLOCK_TICKS,
        cpu_periods=None,
        cpu_throttled_periods=None,
        cpu_throttled_seconds=None,
        cpu_limit_cores=float(pinned_cpus),
        memory_usage_bytes=None,
        memory_peak_bytes=None,
        memory_limit_bytes=None,
        cpu_user_seconds=user_ticks / _CLOCK_TICKS,
        cpu_system_seconds=system_ticks / _CLOCK_TICKS,
    )


def usage(window: Window | None, exit_code: int | None, log_tail: str) -> ServiceUsage:
    """The service's usage over the measured window; unmeasured without one."""
    if window is None:
        return ServiceUsage.unmeasured(exit_code, log_tail)
    before, after = window.before, window.after
    return ServiceUsage(
        window_seconds=window.wall_seconds,
        cpu_seconds=delta(before.cpu_usage_seconds, after.cpu_usage_seconds),
        cpu_limit_cores=after.cpu_limit_cores,
        cpu_periods=delta(before.cpu_periods, after.cpu_periods),
        throttled_periods=delta(before.cpu_throttled_periods, after.cpu_throttled_periods),
        throttled_seconds=delta(before.cpu_throttled_seconds, after.cpu_throttled_seconds),
        memory_peak_bytes=after.memory_peak_bytes,
        memory_peak_scope=window.memory_peak_scope if after.memory_peak_bytes is not None else None,
        memory_limit_bytes=after.memory_limit_bytes,
        exit_code=exit_code,
        log_tail=log_tail,
        user_cpu_seconds=delta(before.cpu_user_seconds, after.cpu_user_seconds),
        system_cpu_seconds=delta(before.cpu_system_seconds, after.cpu_system_seconds),
    )
