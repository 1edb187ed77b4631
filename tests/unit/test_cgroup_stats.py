"""A cgroup's CPU time split into user and system, from recorded v1 and v2 files."""

from pathlib import Path

import pytest

from services.common.cgroup import CgroupPaths, read_stats


def test_v2_cpu_stat_gives_user_and_system(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n")
    stats = read_stats(CgroupPaths(2, tmp_path, tmp_path, tmp_path))
    assert (stats.cpu_usage_seconds, stats.cpu_user_seconds, stats.cpu_system_seconds) == (3.0, 2.0, 1.0)


def test_v1_prefers_the_nanosecond_counters(tmp_path: Path) -> None:
    (tmp_path / "cpuacct.usage").write_text("3000000000\n")
    (tmp_path / "cpuacct.usage_user").write_text("2500000000\n")
    (tmp_path / "cpuacct.usage_sys").write_text("500000000\n")
    (tmp_path / "cpuacct.stat").write_text("user 1\nsystem 1\n")
    stats = read_stats(CgroupPaths(1, tmp_path, tmp_path, tmp_path))
    assert (stats.cpu_user_seconds, stats.cpu_system_seconds) == (2.5, 0.5)


def test_v1_falls_back_to_cpuacct_stat_ticks(tmp_path: Path) -> None:
    (tmp_path / "cpuacct.usage").write_text("3000000000\n")
    (tmp_path / "cpuacct.stat").write_text("user 200\nsystem 100\n")
    stats = read_stats(CgroupPaths(1, tmp_path, tmp_path, tmp_path))
    assert stats.cpu_user_seconds == pytest.approx(2.0) and stats.cpu_system_seconds == pytest.approx(1.0)


def test_without_the_files_the_split_is_unknown(tmp_path: Path) -> None:
    stats = read_stats(CgroupPaths(2, tmp_path, tmp_path, tmp_path))
    assert stats.cpu_user_seconds is None and stats.cpu_system_seconds is None
