"""The local service's limits: its cgroup (or the note why it has none), and what k6 enters between
fork and exec: its CPUs, a signal once the runner is gone (a service's: cgroups.enter_limits)."""

import os
import signal

from labrunner.backends.cgroups import Cgroup, CgroupUnavailable, create_cgroup, parent_death_signal
from labrunner.model.scenario import Scenario


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


def enter_k6_cpus(cpus: tuple[int, ...]) -> None:
    """Runs in k6 between fork and exec: its CPUs, and no load from it once the runner is gone."""
    os.sched_setaffinity(0, cpus)
    parent_death_signal(signal.SIGKILL)
