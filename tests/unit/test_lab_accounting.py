"""The lab's own daemons: pinned to k6's side, their CPU time from a recorded /proc/<pid>/stat,
accounted apart on k6's CPUs and not held against the host."""

import os
import time
from pathlib import Path
from typing import Any

import pytest
from labrunner.observe import interference, lab_cpu, local_stack
from labrunner.observe.interference import CpuTimes, Snapshot, Window
from labrunner.report.sections import host_conditions
from labrunner.results.result import parse_host as _host
from labrunner.results.trust import _host_reasons

# A daemon whose command name holds a space and a parenthesis; utime 700, stime 120, cutime 30,
# cstime 50 ticks (fields 14-17).
PID_STAT = (
    "4242 (influxd (x) 1) S 1 4242 4242 0 -1 4194560 5000 0 0 0 700 120 30 50 20 0 12 0 "
    "123456 1000000 2000 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0"
)
# A 4 s window: k6's CPU 0 busy 1.1 s, its own 0.6 s; the service's CPU 1 busy 2.0 s, all its own.
BEFORE = Snapshot(100.0, {0: CpuTimes(50.0, 0.0), 1: CpuTimes(40.0, 0.0)})
AFTER = Snapshot(104.0, {0: CpuTimes(52.9, 0.0), 1: CpuTimes(42.0, 0.0)})


def test_a_processes_cpu_time_is_utime_stime_and_its_childrens() -> None:
    assert lab_cpu.parse_pid_stat(PID_STAT, ticks_per_second=100) == pytest.approx(9.0)


def test_cpu_seconds_of_recorded_pids_and_none_once_one_exited(tmp_path: Path) -> None:
    for pid in (4242, 4343):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(PID_STAT)
    assert lab_cpu.cpu_seconds((4242, 4343), proc=tmp_path) == pytest.approx(
        18.0 * 100 / os.sysconf("SC_CLK_TCK")
    )
    assert lab_cpu.cpu_seconds((4242, 9999), proc=tmp_path) is None


def test_daemons_go_to_the_lowest_cpu_and_one_cpu_is_not_pinned() -> None:
    assert lab_cpu.daemon_cpus([1, 0]) == (0,)
    assert lab_cpu.daemon_cpus([2, 3, 4, 5]) == (2,)
    assert lab_cpu.daemon_cpus([0]) == ()


def test_a_daemon_started_by_the_lab_runs_pinned(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("needs two CPUs to tell a pinned process from an unpinned one")
    cpus = lab_cpu.daemon_cpus()
    proc = local_stack._spawn(tmp_path, "sleeper", ["sleep", "30"], dict(os.environ), "-", cpus=cpus)
    try:
        cmdline = Path(f"/proc/{proc['pid']}/cmdline")
        deadline = time.monotonic() + 10
        # taskset pins itself, then execs sleep in the same pid: once the cmdline is sleep's, it ran.
        while cmdline.read_bytes().split(b"\0")[0] != b"sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cmdline.read_bytes().split(b"\0")[:-1] == [b"sleep", b"30"]
        assert os.sched_getaffinity(proc["pid"]) == set(cpus)
    finally:
        local_stack._terminate(proc)


def _section(lab: float | None) -> dict[str, Any]:
    window = Window(BEFORE, AFTER, 0.6, lab_cpu_seconds=lab)
    return interference.interference(window, (1,), (0,), service_cpu_seconds=2.0)


def test_the_labs_daemons_are_others_on_k6s_cpus_reported_apart() -> None:
    section = _section(0.4)
    k6 = section["interference"]["k6_cpus"]
    assert k6["others_cpu_seconds"] == pytest.approx(0.5)
    assert (k6["lab_cpu_seconds"], k6["lab_share"]) == (pytest.approx(0.4), pytest.approx(0.1))
    assert "lab_share" not in section["interference"]["service_cpus"]
    assert interference.lab_share(section) == pytest.approx(0.1)
    assert interference.describe(section).endswith(
        "/12.5%"
    )  # the short line; the lab's part is in summary.md
    host = _host(section)
    assert host is not None
    assert host_conditions._figure(host.k6_cpus)[1] == "12.5% (0.50 CPU s), of which lab 10.0% (0.40 CPU s)"
    plain = _section(None)
    assert interference.lab_share(plain) is None and "lab" not in interference.describe(plain)


def test_the_labs_share_is_not_held_against_the_host_but_shown() -> None:
    # 12.5% others on k6's CPU, 10% of it the lab's: 2.5% is below the 5% threshold.
    assert _host_reasons(_host(_section(0.4))) == []
    # Without the lab's figure, or with only 0.2 s of it (7.5% left), the host is suspect.
    assert len(_host_reasons(_host(_section(None)))) == 1
    (reason,) = _host_reasons(_host(_section(0.2)))
    assert "12.5% of k6's CPUs 0" in reason.text
    assert "of which the lab's Prometheus and InfluxDB 0.20, not counted" in reason.text
