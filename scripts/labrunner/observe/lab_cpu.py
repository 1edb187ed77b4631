"""The lab's own daemons (the Prometheus and InfluxDB a run starts): kept on k6's side of the host,
their CPU time read from /proc/<pid>/stat so interference accounts it apart."""

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from labrunner.backends.cgroups import split_cpus

PROC = Path("/proc")
USER_HZ = os.sysconf("SC_CLK_TCK")


def daemon_cpus(available: Iterable[int] | None = None) -> tuple[int, ...]:
    """Where the lab's daemons run: the lowest-numbered CPU, which k6 always has (split_cpus gives
    the service the highest); empty (no pinning) on a one-CPU host, where every CPU is shared."""
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cpus) < 2:
        return ()
    return split_cpus(cpus, len(cpus) - 1).k6


def parse_pid_stat(text: str, ticks_per_second: int = USER_HZ) -> float:
    """CPU seconds of a process and its waited-for children from a /proc/<pid>/stat line:
    utime + stime + cutime + cstime (fields 14-17 of proc(5))."""
    # The command name (field 2) is in parentheses and may hold spaces: count fields after it.
    fields = text.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + cutime + cstime) / ticks_per_second


def cpu_seconds(pids: Sequence[int], proc: Path = PROC) -> float | None:
    """The summed CPU seconds of pids so far; None when one of them cannot be read (it exited)."""
    total = 0.0
    for pid in pids:
        try:
            total += parse_pid_stat((proc / str(pid) / "stat").read_text())
        except (OSError, IndexError, ValueError):
            return None
    return total
