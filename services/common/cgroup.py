"""Read a cgroup's CPU quota, CPU use, throttling and memory (cgroup v2, or v1 controllers).

Inside a container the service's own cgroup is the container, so these numbers are the
container's. Worker counts come from the CPU quota here, never from os.cpu_count(),
which reports the host's CPUs whatever the limit.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_UNLIMITED_V1_BYTES = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63-1


@dataclass(frozen=True)
class CgroupPaths:
    """Where one cgroup's files are: one directory on v2, one per controller on v1."""

    version: int
    cpu: Path
    cpuacct: Path
    memory: Path


@dataclass(frozen=True)
class CgroupStats:
    """A snapshot; None where the kernel does not report the value (or it is unlimited)."""

    cpu_usage_seconds: float | None
    cpu_periods: int | None
    cpu_throttled_periods: int | None
    cpu_throttled_seconds: float | None
    cpu_limit_cores: float | None
    memory_usage_bytes: int | None
    memory_peak_bytes: int | None
    memory_limit_bytes: int | None
    # cpu_usage_seconds split into user and kernel (system) time.
    cpu_user_seconds: float | None = None
    cpu_system_seconds: float | None = None


def _controller_dir(root: Path, controller: str, path: str) -> Path:
    """The controller's directory for path; containers without a cgroup namespace see
    the host path in /proc/self/cgroup but have their own cgroup mounted at the root."""
    for mount in (root / controller, root / "cpu,cpuacct"):
        if mount.is_dir():
            nested = mount / path.lstrip("/")
            return nested if nested.is_dir() else mount
    return root / controller


def own_cgroup(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> CgroupPaths:
    """The cgroup of the calling process."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    if (root / "cgroup.controllers").is_file():  # pure cgroup v2
        unified = root / paths.get("", "/").lstrip("/")
        unified = unified if unified.is_dir() else root
        return CgroupPaths(2, unified, unified, unified)
    return CgroupPaths(
        1,
        cpu=_controller_dir(root, "cpu", paths.get("cpu", "/")),
        cpuacct=_controller_dir(root, "cpuacct", paths.get("cpuacct", "/")),
        memory=_controller_dir(root, "memory", paths.get("memory", "/")),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text and text.lstrip("-").isdigit() else None


def _read_keyed(path: Path) -> dict[str, int]:
    text = _read(path) or ""
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if " " in line)}


def cpu_limit_cores(cgroup: CgroupPaths) -> float | None:
    """The CPU quota in cores (quota / period), None when unlimited."""
    if cgroup.version == 2:
        text = _read(cgroup.cpu / "cpu.max")
        if not text or text.startswith("max"):
            return None
        max_quota, max_period = text.split()
        return int(max_quota) / int(max_period)
    quota = _read_int(cgroup.cpu / "cpu.cfs_quota_us")
    period = _read_int(cgroup.cpu / "cpu.cfs_period_us")
    if quota is None or quota <= 0 or not period:
        return None
    return quota / period


def worker_count(cgroup: CgroupPaths | None = None) -> int:
    """Workers for a CPU budget: the quota rounded up, else the CPUs this process may run on."""
    cores = cpu_limit_cores(cgroup or own_cgroup())
    if cores is None:
        return len(os.sched_getaffinity(0))
    return max(1, math.ceil(cores - 1e-9))


def memory_limit_bytes(cgroup: CgroupPaths) -> int | None:
    """The memory limit, None when unlimited."""
    if cgroup.version == 2:
        text = _read(cgroup.memory / "memory.max")
        return None if not text or text == "max" else int(text)
    limit = _read_int(cgroup.memory / "memory.limit_in_bytes")
    return None if limit is None or limit >= _UNLIMITED_V1_BYTES else limit


def read_stats(cgroup: CgroupPaths) -> CgroupStats:
    """CPU, throttling and memory of the cgroup, including all its processes."""
    cpu_stat = _read_keyed(cgroup.cpu / "cpu.stat")
    if cgroup.version == 2:
        usage_us = cpu_stat.get("usage_usec")
        throttled_us = cpu_stat.get("throttled_usec")
        usage = _read_int(cgroup.memory / "memory.current")
        peak = _read_int(cgroup.memory / "memory.peak")
        return CgroupStats(
            cpu_usage_seconds=None if usage_us is None else usage_us / 1e6,
            cpu_periods=cpu_stat.get("nr_periods"),
            cpu_throttled_periods=cpu_stat.get("nr_throttled"),
            cpu_throttled_seconds=None if throttled_us is None else throttled_us / 1e6,
            cpu_limit_cores=cpu_limit_cores(cgroup),
            memory_usage_bytes=usage,
            memory_peak_bytes=peak,
            memory_limit_bytes=memory_limit_bytes(cgroup),
            cpu_user_seconds=_scaled(cpu_stat.get("user_usec"), 1e6),
            cpu_system_seconds=_scaled(cpu_stat.get("system_usec"), 1e6),
        )
    usage_ns = _read_int(cgroup.cpuacct / "cpuacct.usage")
    throttled_ns = cpu_stat.get("throttled_time")
    return CgroupStats(
        cpu_usage_seconds=None if usage_ns is None else usage_ns / 1e9,
        cpu_periods=cpu_stat.get("nr_periods"),
        cpu_throttled_periods=cpu_stat.get("nr_throttled"),
        cpu_throttled_seconds=None if throttled_ns is None else throttled_ns / 1e9,
        cpu_limit_cores=cpu_limit_cores(cgroup),
        memory_usage_bytes=_read_int(cgroup.memory / "memory.usage_in_bytes"),
        memory_peak_bytes=_read_int(cgroup.memory / "memory.max_usage_in_bytes"),
        memory_limit_bytes=memory_limit_bytes(cgroup),
        **_user_system_v1(cgroup.cpuacct),
    )


def _user_system_v1(cpuacct: Path) -> dict[str, float | None]:
    """User and system CPU seconds: cpuacct.usage_user/usage_sys (ns, kernel 4.7+), else cpuacct.stat.

    cpuacct.stat counts whole clock ticks (USER_HZ), too coarse for one request but good for a
    share over a measured window.
    """
    user_ns, system_ns = _read_int(cpuacct / "cpuacct.usage_user"), _read_int(cpuacct / "cpuacct.usage_sys")
    if user_ns is not None and system_ns is not None:
        return {"cpu_user_seconds": user_ns / 1e9, "cpu_system_seconds": system_ns / 1e9}
    ticks = _read_keyed(cpuacct / "cpuacct.stat")
    hz = os.sysconf("SC_CLK_TCK")
    return {
        "cpu_user_seconds": _scaled(ticks.get("user"), hz),
        "cpu_system_seconds": _scaled(ticks.get("system"), hz),
    }


def _scaled(value: int | None, per_second: float) -> float | None:
    return None if value is None else value / per_second
