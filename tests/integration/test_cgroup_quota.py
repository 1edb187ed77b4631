"""A scenario's cgroup starts at its whole CPUs and takes the profile's quota once the service listens."""

import os

import pytest
from labrunner.backends.cgroups import create_cgroup, remove_cgroup, set_cpu_quota

from services.common.cgroup import cpu_limit_cores, worker_count

pytestmark = pytest.mark.serial  # a live cgroup's CPU quota: alone


def test_the_quota_changes_on_a_live_cgroup_and_the_worker_count_stays_the_same() -> None:
    cgroup = create_cgroup(f"quota-test-{os.getpid()}", 1.0, 256 * 2**20)
    try:
        assert cpu_limit_cores(cgroup.paths) == 1.0
        started_with = worker_count(cgroup.paths)
        set_cpu_quota(cgroup, 0.25)
        assert cpu_limit_cores(cgroup.paths) == 0.25
        assert worker_count(cgroup.paths) == started_with == 1
    finally:
        remove_cgroup(cgroup)
