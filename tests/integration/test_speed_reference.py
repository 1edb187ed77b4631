"""The speed reference: a real process in its own cgroup at its quota, counting units that read() sees,
and nothing left once it stops."""

import os
import time
from pathlib import Path

import pytest
from labrunner.backends.cgroups import tasks
from labrunner.run.speed_reference import REFERENCE_CPUS, SpeedReference

from services.common.cgroup import cpu_limit_cores, own_cgroup

pytestmark = pytest.mark.serial  # a live cgroup's CPU quota: alone

UNITS = 20  # enough units to take a CPU per unit from; bounded by count, not by time


def test_the_reference_counts_units_at_its_quota_and_leaves_nothing(tmp_path: Path) -> None:
    reference = SpeedReference(f"reference-test-{os.getpid()}", tmp_path)
    assert reference.read() is None  # not started: the calibration's time
    cpu = max(os.sched_getaffinity(0))
    reference.start((cpu,))
    try:
        pid, cgroup = reference.pid, reference.cgroup
        assert pid is not None and cgroup is not None
        assert os.sched_getaffinity(pid) == {cpu}
        assert tasks(cgroup) == {pid} and cpu_limit_cores(cgroup.paths) == REFERENCE_CPUS
        first = reference.read()
        assert first is not None and first[0] >= 1 and first[1] > 0
        later = first
        deadline = time.monotonic() + 60  # a safety net only: the loop ends on the count
        while later[0] < first[0] + UNITS and time.monotonic() < deadline:
            time.sleep(0.1)
            later = reference.read() or later
        units, cpu_s = later[0] - first[0], (later[1] - first[1]) / 1e9
        assert units >= UNITS and cpu_s > 0  # a CPU per unit to divide by
    finally:
        reference.stop()
    assert reference.read() is None
    assert not reference.counter_path.exists()
    assert reference.cgroup is None and not any(d.exists() for d in cgroup.dirs)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_reference_that_cannot_start_leaves_no_cgroup(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    reference = SpeedReference(f"reference-fails-{os.getpid()}", not_a_directory)
    with pytest.raises(OSError):  # its counter file cannot be made: the session says so and goes on
        reference.start((max(os.sched_getaffinity(0)),))
    assert reference.cgroup is None and reference.pid is None and reference.read() is None
    assert not any(own_cgroup().cpu.glob(f"protolab/reference-fails-{os.getpid()}-*"))
