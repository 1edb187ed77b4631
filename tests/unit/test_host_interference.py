"""Unit tests: interference from /proc/stat snapshots (others' busy time and steal on a scenario's CPUs,
the userspace relay's apart), its suspect flag and progress-line figure, the metered backend that
reads /proc/stat around measured runs, and the report's interference and calibration warnings."""

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from labrunner.backends.base import K6Invocation, K6Process, ServiceHandle, ServiceUsage
from labrunner.cli import report as report_cli
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.observe import interference, steal_clock
from labrunner.observe.interference import CpuTimes, MeteredBackend, Snapshot, Window
from labrunner.report import payload
from labrunner.report.sections import host_conditions as host_section
from labrunner.results.result import parse_host
from labrunner.results.store import RESULT_SCHEMA, result_path
from labrunner.results.trust import _host_reasons

from tests.support import ROOT, ok_result

PROC_STAT = """\
cpu  300 10 100 1000 20 5 15 30 40 0
cpu0 100 0 50 500 10 0 5 10 0 0
cpu1 200 10 50 500 10 5 10 20 40 0
intr 12345 1 2 3
ctxt 987654
btime 1700000000
processes 4242
"""


def _cpu(idle: float, steal: float = 0.0) -> CpuTimes:
    return CpuTimes(idle=idle, steal=steal)


def _window(before: Snapshot, after: Snapshot, k6: float | None = 1.0) -> Window:
    return Window(before, after, k6)


# Over a 4 s window: CPU 1 (the service's) busy 2.2 s, CPU 0 (k6's) busy 1.1 s, 0.04 s stolen on 1.
BEFORE = Snapshot(100.0, {0: _cpu(50.0), 1: _cpu(40.0, steal=1.0)})
AFTER = Snapshot(104.0, {0: _cpu(52.9), 1: _cpu(41.76, steal=1.04)})


def test_parse_proc_stat_reads_per_cpu_lines_in_seconds() -> None:
    cpus = interference.parse_proc_stat(PROC_STAT, ticks_per_second=100)
    assert sorted(cpus) == [0, 1]  # the "cpu" total and the other lines are left out
    # busy = user + nice + system + irq + softirq; guest (40) is already inside user.
    assert cpus[0] == CpuTimes(idle=5.10, steal=0.10)  # idle + iowait
    assert cpus[1] == CpuTimes(idle=5.10, steal=0.20)


def test_parse_proc_stat_of_an_old_kernel_without_steal() -> None:
    assert interference.parse_proc_stat("cpu3 100 0 100 800\n", ticks_per_second=100) == {
        3: CpuTimes(idle=8.0, steal=0.0)
    }


def test_read_snapshot_reads_this_hosts_proc_stat() -> None:
    first = interference.read_snapshot()
    second = interference.read_snapshot()
    assert first.cpus and set(first.cpus) == set(second.cpus) and second.at > first.at
    assert all(second.cpus[c].idle >= first.cpus[c].idle >= 0 for c in first.cpus)


def test_others_are_busy_time_minus_the_scenarios_own() -> None:
    section = interference.interference(_window(BEFORE, AFTER, k6=1.0), (1,), (0,), service_cpu_seconds=2.0)
    assert section["measured"] is True and section["reason"] is None
    figures = section["interference"]
    assert figures["shared"] is False
    service, k6 = figures["service_cpus"], figures["k6_cpus"]
    assert service["cpus"] == [1] and k6["cpus"] == [0]
    assert service["capacity_cpu_seconds"] == pytest.approx(4.0)
    assert service["idle_cpu_seconds"] == pytest.approx(1.76)
    assert service["busy_cpu_seconds"] == pytest.approx(2.2)  # 4 s - idle - 0.04 s stolen
    assert service["own_cpu_seconds"] == pytest.approx(2.0)
    assert service["others_cpu_seconds"] == pytest.approx(0.2)
    assert service["share"] == pytest.approx(0.05)
    assert k6["others_cpu_seconds"] == pytest.approx(0.1)
    assert k6["share"] == pytest.approx(0.025)
    assert section["steal_seconds"] == pytest.approx(0.04)
    assert section["steal_share"] == pytest.approx(0.04 / 8.0)
    assert section["window_seconds"] == pytest.approx(4.0)
    json.dumps(section)  # plain data


def test_overlapping_cpu_sets_are_one_figure_with_both_own_times_subtracted_once() -> None:
    section = interference.interference(
        _window(BEFORE, AFTER, k6=1.0), (0, 1), (0, 1), service_cpu_seconds=2.0
    )
    figures = section["interference"]
    assert figures["shared"] is True and figures["service_cpus"] == figures["k6_cpus"]
    union = figures["service_cpus"]
    assert union["cpus"] == [0, 1]
    assert union["busy_cpu_seconds"] == pytest.approx(3.3)
    assert union["own_cpu_seconds"] == pytest.approx(3.0)
    assert union["others_cpu_seconds"] == pytest.approx(0.3)
    assert union["share"] == pytest.approx(0.3 / 8.0)


def test_unknown_own_time_leaves_others_unknown_but_keeps_steal() -> None:
    section = interference.interference(_window(BEFORE, AFTER, k6=None), (1,), (0,), service_cpu_seconds=None)
    figures = section["interference"]
    assert figures["service_cpus"]["share"] is None and figures["k6_cpus"]["others_cpu_seconds"] is None
    assert figures["service_cpus"]["busy_cpu_seconds"] == pytest.approx(2.2)
    assert section["steal_seconds"] == pytest.approx(0.04)
    assert _suspect(section) == []


@pytest.mark.parametrize(
    ("window", "cpus", "reason", "expected"),
    [
        (None, (1,), None, "no measured k6 run"),
        (_window(BEFORE, AFTER), (7,), None, "CPU(s) 7 not in /proc/stat"),
        (_window(BEFORE, AFTER), (1,), "the engine is elsewhere", "the engine is elsewhere"),
    ],
)
def test_unknown_interference_says_why(
    window: Window | None, cpus: tuple[int, ...], reason: str | None, expected: str
) -> None:
    section = interference.interference(window, cpus, (0,), 1.0, reason)
    assert section == {
        "measured": False,
        "reason": expected,
        "window_seconds": None,
        "interference": None,
        "steal_seconds": None,
        "steal_share": None,
    }
    assert _suspect(section) == []
    assert interference.describe(section) == "others n/a"


def test_where_proc_stat_describes_the_scenarios_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    here, elsewhere = SimpleNamespace(cpus_elsewhere=None), SimpleNamespace(cpus_elsewhere="on engine B")
    assert interference.unavailable(here, stat) is None  # type: ignore[arg-type]
    assert interference.unavailable(elsewhere, stat) == "on engine B"  # type: ignore[arg-type]
    missing = interference.unavailable(here, tmp_path / "absent")  # type: ignore[arg-type]
    assert missing is not None and "cannot be read" in missing


def _with_share(service: float, k6: float, steal: float = 0.0, shared: bool = False) -> dict[str, Any]:
    def figure(share: float, cpus: list[int]) -> dict[str, Any]:
        return {"cpus": cpus, "others_cpu_seconds": share * 4.0, "share": share}

    return {
        "measured": True,
        "interference": {
            "service_cpus": figure(service, [1]),
            "k6_cpus": figure(service if shared else k6, [0]),
            "shared": shared,
        },
        "steal_seconds": steal * 8.0,
        "steal_share": steal,
    }


def _suspect(section: dict[str, Any] | None) -> list[str]:
    """The judge's reasons on a result that has only this host section (the host's reasons alone)."""
    return [reason.text for reason in _host_reasons(parse_host(section))]


def test_suspect_above_five_percent_of_either_cpu_set_or_of_steal() -> None:
    assert _suspect(_with_share(0.049, 0.049, steal=0.049)) == []
    [service] = _suspect(_with_share(0.051, 0.0))
    assert service.startswith("other processes used 5.1% of the service's CPUs 1 (0.20 CPU s)")
    assert service.endswith("(> 5%): host interference")
    [k6] = _suspect(_with_share(0.0, 0.30))
    assert k6.startswith("other processes used 30.0% of k6's CPUs 0 (1.20 CPU s)")
    [steal] = _suspect(_with_share(0.0, 0.0, steal=0.06))
    assert steal.startswith("the hypervisor took 6.0% of the scenario's CPUs (steal, 0.48 s)")
    [shared] = _suspect(_with_share(0.2, 0.0, shared=True))  # one figure, one reason
    assert "the CPUs the service shares with k6, 1" in shared
    assert _suspect(None) == []


def test_progress_line_figure() -> None:
    assert interference.describe(_with_share(0.008, 0.021)) == "others 0.8/2.1%"
    assert interference.describe(_with_share(0.1, 0.0, shared=True)) == "others 10.0% shared"
    assert interference.describe(None) == "others n/a"
    assert interference.share(_with_share(0.008, 0.021), "k6_cpus") == pytest.approx(0.021)
    assert interference.share({"measured": False, "interference": None}, "k6_cpus") is None


class _FakeBackend:
    """Counts calls; a measured k6 run uses 1.5 CPU s."""

    name = "local"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        raise NotImplementedError

    def service_ended(self, handle: ServiceHandle) -> str | None:
        self.calls.append("service_ended")
        return None

    def service_log_tail(self, handle: ServiceHandle) -> str:
        return "tail"

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        self.calls.append(f"run_k6 measured={measured}")
        return K6Process(0, 3.0, 1.5 if measured else 0.5, 1, "")

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        return ServiceUsage.unmeasured(0, "")

    def close(self) -> None:
        self.calls.append("close")


def test_metered_backend_reads_proc_stat_around_measured_runs_only() -> None:
    inner = _FakeBackend()
    snapshots = iter([BEFORE, AFTER, AFTER, BEFORE])
    reads: list[int] = []

    def read() -> Snapshot:
        reads.append(1)
        return next(snapshots)

    metered = MeteredBackend(inner, read)
    handle: Any = None
    invocation: Any = None
    assert metered.name == "local"
    metered.run_k6(handle, invocation, measured=False)
    assert reads == [] and metered.window is None
    metered.run_k6(handle, invocation, measured=True)
    assert metered.window == Window(
        BEFORE, AFTER, 1.5, includes_steal=steal_clock.this_kernel().includes_steal
    )
    metered.run_k6(handle, invocation, measured=True)  # a capacity search's next step: the last counts
    assert metered.window == Window(
        AFTER, BEFORE, 1.5, includes_steal=steal_clock.this_kernel().includes_steal
    )
    assert metered.service_log_tail(handle) == "tail"
    metered.close()
    assert inner.calls == [
        "run_k6 measured=False",
        "run_k6 measured=True",
        "run_k6 measured=True",
        "close",
    ]
    unmetered = MeteredBackend(_FakeBackend(), None)
    unmetered.run_k6(handle, invocation, measured=True)
    assert unmetered.window is None


def test_the_speed_reference_is_read_around_the_window_and_is_the_labs_own_time() -> None:
    # The reference's counters (units, CPU ns) before and after the measured run, and a run without it.
    counters = iter([(1_000, 400_000_000), (1_800, 720_000_000)])
    metered = MeteredBackend(_FakeBackend(), iter([BEFORE, AFTER]).__next__, reference=counters.__next__)
    handle: Any = None
    invocation: Any = None
    metered.run_k6(handle, invocation, measured=True)
    window = metered.window
    assert window is not None and (window.reference_units, window.reference_cpu_seconds) == (800, 0.32)
    section = interference.interference(window, (1,), (0,), service_cpu_seconds=1.88)
    assert section["speed_reference"] == {"units": 800, "cpu_seconds": 0.32, "seconds_per_unit": 0.0004}
    service = section["interference"]["service_cpus"]
    # CPU 1 was busy 2.2 s: the service's 1.88 s and the reference's 0.32 s, nobody else's.
    assert service["own_cpu_seconds"] == pytest.approx(2.2)
    assert service["others_cpu_seconds"] == pytest.approx(0)
    host = parse_host(section)
    assert host is not None and host.reference_seconds_per_unit == 0.0004
    # Stopped (the calibration after the run): no reading, and no figure.
    stopped = MeteredBackend(_FakeBackend(), iter([BEFORE, AFTER]).__next__, reference=lambda: None)
    stopped.run_k6(handle, invocation, measured=True)
    assert stopped.window is not None and stopped.window.reference_units is None
    assert interference.interference(stopped.window, (1,), (0,), 1.88)["speed_reference"] is None


def _run_dir(path: Path, calibration_s: tuple[float, float], others: float) -> Path:
    """A one-result run directory as the runner leaves it, with payload.json so nothing is measured."""
    [scenario] = expand(
        load_matrix(ROOT / "matrix.toml"), "local", "ci", Overrides(targets=("grpc",))
    ).scenarios
    section = interference.interference(
        Window(
            Snapshot(0.0, {0: _cpu(0), 1: _cpu(0)}),
            Snapshot(4.0, {0: _cpu(3.0), 1: _cpu(3.0 - others * 4)}),
            1.0,
        ),
        (1,),
        (0,),
        service_cpu_seconds=1.0,
    )
    result = ok_result(
        scenario,
        requests=2000,
        rps=666.7,
        latency_ms={"avg": 2.0, "p50": 2.0, "p90": 3.0, "p95": 4.0, "p99": 5.0},
        received_bytes=2_000_000,
        window_s=3.0,
        cpu_seconds=1.0,
        quota_used=0.67,
        error_rate=0.0,
    )
    result |= {"schema": RESULT_SCHEMA, "host": section, "suspect": _suspect(section)}
    write_json_atomic(result_path(path, scenario.id), result)
    before, after = calibration_s
    write_json_atomic(
        path / "manifest.json",
        {
            "run_id": path.name,
            "git": {"sha": "abc"},
            "host": {"cpu_model": "AMD EPYC"},
            "calibration": {
                when: {"cpu_seconds_per_unit": s, "median_over_fastest": 1.1, "cpus": [1]}
                for when, s in (("before", before), ("after", after))
            },
        },
    )
    row = payload.PayloadRow(100, 20000, 4000, 15000, 3800)
    write_json_atomic(path / "payload.json", {"schema": payload.SCHEMA, "rows": [asdict(row)]})
    return path


def test_report_shows_interference_calibration_and_their_warnings(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "now", (0.0005, 0.00055), others=0.2)
    base = _run_dir(tmp_path / "base", (0.00042, 0.00042), others=0.0)
    assert report_cli.main([str(run), "--baseline", str(base)]) == 0
    md = (run / "report.md").read_text()
    assert "**Warning: the calibration changed by +10.0% between the start and the end of the run**" in md
    assert "**Warning: the calibrations differ by +25.0%**" in md
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| others max | CPU / req (cal) |" in summary
    # 1.0 CPU s / 2000 requests = 0.5 ms per request, over a unit of 0.525 ms.
    assert "| 20.0% | 0.952 |" in summary
    section = md.split("## Host interference and calibration", 1)[1].split("\n## ", 1)[0]
    assert "| 1 | 20.0% (0.80 CPU s) | 0 | 0.0% (0.00 CPU s) | 0.0% |" in section
    assert "| before | 500.0 | 1.10x | 1 |" in section and "| after | 550.0 | 1.10x | 1 |" in section
    assert "suspect: other processes used 20.0% of the service's CPUs 1" in md
    assert report_cli.main([str(base)]) == 0
    quiet = (base / "report.md").read_text()
    assert "Warning" not in quiet and "moved by +0.0% from before to after" in quiet


def test_the_userspace_relay_is_interference_on_k6s_cpus_reported_apart() -> None:
    # k6's CPU 0 was busy 1.1 s of 4 s; k6 itself took 0.6 s and the relay 0.4 s of the rest.
    window = Window(BEFORE, AFTER, 0.6, relay_cpu_seconds=0.4)
    section = interference.interference(window, (1,), (0,), service_cpu_seconds=2.0)
    k6 = section["interference"]["k6_cpus"]
    assert k6["own_cpu_seconds"] == pytest.approx(0.6)  # the relay is not k6's own time
    assert k6["others_cpu_seconds"] == pytest.approx(0.5)  # others include it...
    assert k6["relay_cpu_seconds"] == pytest.approx(0.4)  # ...and say how much was the relay
    assert k6["relay_share"] == pytest.approx(0.1)
    assert "relay_cpu_seconds" not in section["interference"]["service_cpus"]
    assert interference.relay_share(section) == pytest.approx(0.1)
    assert interference.describe(section) == "others 5.0/12.5%"  # the relay's part: in summary.md
    (reason,) = [r for r in _suspect(section) if "k6's CPUs" in r]
    assert "of which the userspace link emulator 0.40" in reason
    # Without a relay, nothing about one.
    plain = interference.interference(Window(BEFORE, AFTER, 0.6), (1,), (0,), service_cpu_seconds=2.0)
    assert "relay_share" not in plain["interference"]["k6_cpus"] and interference.relay_share(plain) is None
    host = parse_host(section)
    assert host is not None
    cell = host_section._figure(host.k6_cpus)[1]
    assert cell == "12.5% (0.50 CPU s), of which relay 10.0% (0.40 CPU s)"


def test_metered_backend_keeps_the_relays_cpu_of_the_last_measured_run() -> None:
    class _Relayed(_FakeBackend):
        def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
            return K6Process(0, 3.0, 1.5, 1, "", relay_cpu_seconds=0.25 if measured else 9.0)

    for read in (None, iter([BEFORE, AFTER]).__next__):
        metered = MeteredBackend(_Relayed(), read)
        handle: Any = None
        metered.run_k6(handle, None, measured=False)  # type: ignore[arg-type]
        assert metered.relay_cpu_seconds is None
        metered.run_k6(handle, None, measured=True)  # type: ignore[arg-type]
        assert metered.relay_cpu_seconds == 0.25
        if read is not None:
            assert metered.window == Window(
                BEFORE, AFTER, 1.5, 0.25, steal_clock.this_kernel().includes_steal
            )


def test_others_share_of_the_whole_host_excludes_our_own_cpu_time() -> None:
    # BEFORE -> AFTER: 3.3 s busy of 8 s over both CPUs; 2.5 s of it ours.
    assert interference.others_share(BEFORE, AFTER, own_cpu_seconds=2.5) == pytest.approx(0.8 / 8.0)
    assert interference.others_share(BEFORE, AFTER, own_cpu_seconds=5.0) == 0.0  # never below zero
