"""The docker backend's usage from two docker stats snapshots: cgroup v1 and v2, no measured window."""

import pytest
from labrunner.backends.docker.stats import (
    StatsSnapshot,
    UsageWindow,
    memory_peak_from_metrics,
    usage_from_stats,
)

from tests.docker_fake import docker_stats

# --- Usage from stats --------------------------------------------------------------------------


def test_usage_from_two_stats_snapshots_cgroup_v1() -> None:
    before = StatsSnapshot.parse(docker_stats(1.0, 10, 1, 0.1, usage=1, max_usage=300, limit=512))
    after = StatsSnapshot.parse(docker_stats(2.5, 40, 6, 0.35, usage=1, max_usage=900, limit=512))
    usage = usage_from_stats(UsageWindow(before, after, 3.0, None), 0.5, 0, "tail")
    assert usage.window_seconds == 3.0
    assert usage.cpu_seconds == pytest.approx(1.5)
    assert usage.user_cpu_seconds == pytest.approx(1.05) and usage.system_cpu_seconds == pytest.approx(0.45)
    assert (usage.cpu_periods, usage.throttled_periods) == (30, 5)
    assert usage.throttled_seconds == pytest.approx(0.25)
    assert (usage.memory_peak_bytes, usage.memory_peak_scope, usage.memory_limit_bytes) == (
        900,
        "lifetime",
        512,
    )
    assert (usage.cpu_limit_cores, usage.exit_code, usage.log_tail) == (0.5, 0, "tail")


def test_usage_cgroup_v2_takes_the_peak_from_the_service_metric() -> None:
    before = StatsSnapshot.parse(docker_stats(1.0, 10, 1, 0.1, usage=1, limit=512))
    after = StatsSnapshot.parse(docker_stats(2.0, 20, 1, 0.1, usage=1, limit=512))
    assert usage_from_stats(UsageWindow(before, after, 1.0, 400), 1.0, 0, "").memory_peak_bytes == 400
    no_peak = usage_from_stats(UsageWindow(before, after, 1.0, None), 1.0, 0, "")
    assert (no_peak.memory_peak_bytes, no_peak.memory_peak_scope) == (None, None)
    assert memory_peak_from_metrics("x 1\nprotolab_cgroup_memory_peak_bytes 1.5e+08\n") == 150_000_000


def test_usage_without_a_measured_window() -> None:
    usage = usage_from_stats(None, 2.0, 137, "killed")
    assert (usage.window_seconds, usage.cpu_seconds, usage.exit_code, usage.log_tail) == (
        None,
        None,
        137,
        "killed",
    )
