"""A profile's limits for a local process: a fresh cgroup (v2 or v1) and a CPU split with k6.

Each scenario's cgroup is created under the runner's own cgroup (v1) so any limit already
placed on the runner keeps applying to the service; on v2 the "no internal processes"
rule forbids that, so it goes under <root>/protolab. The child joins its cgroup before
exec, so every worker it forks is inside from the start.
"""

import contextlib
import ctypes
import errno
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.cgroup import CGROUP_ROOT, CgroupPaths, own_cgroup

CFS_PERIOD_US = 100_000
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up once here: a child between fork and exec must not dlopen (see enter_limits).
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_PIN_PASSES = 10  # pin_threads: a service that keeps starting threads off its CPUs is an error
_RMDIR_TIMEOUT_S = 5.0


class CgroupUnavailable(OSError):
    """No writable cgroup hierarchy with the cpu and memory controllers."""


@dataclass(frozen=True)
class CpuSplit:
    """Which CPUs the service and k6 run on."""

    service: tuple[int, ...]
    k6: tuple[int, ...]

    @property
    def shared(self) -> bool:
        return bool(set(self.service) & set(self.k6))


@dataclass(frozen=True)
class Cgroup:
    """A cgroup this runner created: stats paths plus the directories to join and remove."""

    version: int
    paths: CgroupPaths
    dirs: tuple[Path, ...]  # one per distinct controller directory


def split_cpus(available: Sequence[int], service_cpus: int) -> CpuSplit:
    """The service gets the highest-numbered CPUs, k6 the rest; both share when there is no rest."""
    cpus = sorted(available)
    if len(cpus) > service_cpus:
        return CpuSplit(service=tuple(cpus[-service_cpus:]), k6=tuple(cpus[:-service_cpus]))
    return CpuSplit(service=tuple(cpus), k6=tuple(cpus))


def create_cgroup(name: str, cpus: float, memory_bytes: int, root: Path = CGROUP_ROOT) -> Cgroup:
    """Create the cgroup with a CFS quota of `cpus` and a memory limit without swap."""
    quota = quota_us(cpus)
    try:
        if (root / "cgroup.controllers").is_file():
            return _create_v2(root, name, quota, memory_bytes)
        return _create_v1(root, name, quota, memory_bytes)
    except OSError as exc:
        raise CgroupUnavailable(exc.errno, f"cannot create cgroup {name}: {exc}") from exc


def set_cpu_quota(cgroup: Cgroup, cpus: float) -> None:
    """Change the CFS quota of a running cgroup to `cpus`."""
    if cgroup.version == 2:
        (cgroup.paths.cpu / "cpu.max").write_text(f"{quota_us(cpus)} {CFS_PERIOD_US}")
    else:
        (cgroup.paths.cpu / "cpu.cfs_quota_us").write_text(str(quota_us(cpus)))


def pin_threads(cgroup: Cgroup, cpus: Sequence[int]) -> None:
    """Every thread of every process in the cgroup onto `cpus`, until a pass finds none elsewhere (a
    thread started during a pass inherits its creator's CPUs, which may not have moved yet); OSError
    when threads are still elsewhere after _PIN_PASSES passes."""
    wanted = set(cpus)
    for _ in range(_PIN_PASSES):
        moved = False
        for pid in tasks(cgroup):
            with contextlib.suppress(FileNotFoundError):  # the process ended meanwhile
                for tid in (int(name) for name in os.listdir(f"/proc/{pid}/task")):
                    with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                        if os.sched_getaffinity(tid) != wanted:
                            os.sched_setaffinity(tid, wanted)
                            moved = True
        if not moved:
            return
    raise OSError(f"threads of cgroup {cgroup.dirs[0].name} still ran off CPUs {sorted(wanted)}")


def enter_limits(cgroup: Cgroup | None, cpus: tuple[int, ...]) -> None:
    """Runs in the child between fork and exec.

    preexec_fn is unsafe when the parent has threads that may hold locks at fork time;
    this function only makes system calls (open, write, sched_setaffinity, prctl), so none is needed.
    """
    if cgroup is not None:
        join_cgroup(cgroup)
    os.sched_setaffinity(0, cpus)
    # A runner killed outright (SIGKILL, OOM) cannot stop its service: the kernel asks it to
    # stop gracefully instead, and its workers follow their supervisor.
    parent_death_signal(signal.SIGTERM)


def parent_death_signal(sig: int) -> None:
    """In a child between fork and exec: `sig` once the runner is gone (prctl PR_SET_PDEATHSIG)."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def quota_us(cpus: float) -> int:
    return max(1000, round(cpus * CFS_PERIOD_US))  # the kernel's minimum quota is 1 ms


def join_cgroup(cgroup: Cgroup) -> None:
    """Move the calling process into the cgroup ("0" = the writer itself)."""
    for directory in cgroup.dirs:
        fd = os.open(directory / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def reset_memory_peak(cgroup: Cgroup) -> bool:
    """Restart the peak-memory watermark; False when this kernel cannot."""
    name = "memory.peak" if cgroup.version == 2 else "memory.max_usage_in_bytes"
    try:
        (cgroup.paths.memory / name).write_text("0")
    except OSError:
        return False
    return True


def tasks(cgroup: Cgroup) -> set[int]:
    """Pids still in the cgroup."""
    pids: set[int] = set()
    for directory in cgroup.dirs:
        try:
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        except OSError:
            continue
    return pids


def remove_cgroup(cgroup: Cgroup) -> None:
    """Kill anything left inside, then remove the directories (rmdir waits for tasks to drain)."""
    for pid in tasks(cgroup):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _RMDIR_TIMEOUT_S
    for directory in cgroup.dirs:
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)  # the tasks just killed leave within moments
        with contextlib.suppress(OSError):  # the shared protolab/ parent, once no run uses it
            directory.parent.rmdir()


def _create_v1(root: Path, name: str, quota_us: int, memory_bytes: int) -> Cgroup:
    own = own_cgroup(root)
    cpu, cpuacct, memory = (base / "protolab" / name for base in (own.cpu, own.cpuacct, own.memory))
    dirs = tuple(dict.fromkeys(d.resolve() for d in (cpu, cpuacct, memory)))
    cgroup = Cgroup(1, CgroupPaths(1, cpu=cpu, cpuacct=cpuacct, memory=memory), dirs)
    _make_dirs(cgroup)
    try:
        (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(quota_us))
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        swap = memory / "memory.memsw.limit_in_bytes"  # only with swap accounting on
        if swap.exists():
            swap.write_text(str(memory_bytes))
    except OSError:
        remove_cgroup(cgroup)
        raise
    return cgroup


def _create_v2(root: Path, name: str, quota_us: int, memory_bytes: int) -> Cgroup:
    parent = root / "protolab"
    parent.mkdir(exist_ok=True)
    for directory in (root, parent):
        (directory / "cgroup.subtree_control").write_text("+cpu +memory")
    path = parent / name
    cgroup = Cgroup(2, CgroupPaths(2, cpu=path, cpuacct=path, memory=path), (path,))
    _make_dirs(cgroup)
    try:
        (path / "cpu.max").write_text(f"{quota_us} {CFS_PERIOD_US}")
        (path / "memory.max").write_text(str(memory_bytes))
        swap = path / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
    except OSError:
        remove_cgroup(cgroup)
        raise
    return cgroup


def _make_dirs(cgroup: Cgroup) -> None:
    if any(d.exists() for d in cgroup.dirs):
        remove_cgroup(cgroup)  # left behind by an interrupted run with the same run id
    made: list[Path] = []
    try:
        for directory in cgroup.dirs:
            directory.mkdir(parents=True)
            made.append(directory)
    except OSError:
        for directory in reversed(made):
            directory.rmdir()
        raise
