"""The local service's limits: its cgroup (or the note why it has none), and what a child enters
between fork and exec: the cgroup, its CPUs, a signal once the runner is gone."""

import ctypes
import os
import signal

from labrunner.backends.cgroups import Cgroup, CgroupUnavailable, create_cgroup, join_cgroup
from labrunner.model.scenario import Scenario

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up once here: a child between fork and exec must not dlopen (see enter_limits).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def service_cgroup(run_id: str, scenario: Scenario, notes: list[str]) -> Cgroup | None:
    """The scenario's cgroup at its whole CPUs; None, with a note saying why, when none can be made."""
    name = f"{run_id}-{scenario.id}"
    try:
        # The service starts at the speed of its whole CPUs and is measured at the profile's quota
        # (set once it listens): importing its modules is no part of what a profile limits,
        # and under a quarter CPU it took most of a scenario's overhead. The quota it reads
        # at start gives the same workers, ceil(cpus), as the profile's would.
        return create_cgroup(name, scenario.profile.whole_cpus, scenario.profile.memory_bytes)
    except CgroupUnavailable as exc:
        notes.append(
            f"limits approximate: {exc.strerror}; the service is only pinned to "
            f"{scenario.profile.whole_cpus} CPU(s) and its memory is not limited"
        )
        return None


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
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def enter_k6_cpus(cpus: tuple[int, ...]) -> None:
    """Runs in k6 between fork and exec: its CPUs, and no load from it once the runner is gone."""
    os.sched_setaffinity(0, cpus)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
