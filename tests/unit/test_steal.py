"""Others when the task clock includes steal and when it does not, from recorded /proc/stat figures."""

import gzip
from pathlib import Path

import pytest
from labrunner.observe import interference, steal_clock
from labrunner.observe.interference import Snapshot, Window, parse_proc_stat

CPU1 = "cpu1 0 0 0 0 0 0 0 0 0 0\n"  # the service's CPU, not looked at here
# One CPU (cpu0 = k6's) over a 10 s window, in USER_HZ=100 ticks: idle+iowait and steal moved.
PROC_STAT_BEFORE = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 50000 0 20000 90000 100 0 300 1000 0 0\n" + CPU1
# A kernel whose task clock leaves steal out: 5.0 s idle, 0.5 s stolen, so 4.5 s busy.
EXCLUDING_AFTER = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 50400 0 20040 90500 100 0 300 1050 0 0\n" + CPU1
# docs/example-report's quart-h1-tls r1 on k6's CPU: 3.4 s idle, 0.94 s stolen, own (rusage) 6.62 s.
INCLUDING_AFTER = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 50500 0 20060 90340 100 0 300 1094 0 0\n" + CPU1


def _figure(after: str, own: float, seconds: float, includes_steal: bool | None) -> dict[str, object]:
    window = Window(
        Snapshot(0.0, parse_proc_stat(PROC_STAT_BEFORE, 100)),
        Snapshot(seconds, parse_proc_stat(after, 100)),
        k6_cpu_seconds=own,
        includes_steal=includes_steal,
    )
    section = interference.interference(window, (1,), (0,), service_cpu_seconds=None)
    return section["interference"]["k6_cpus"]  # type: ignore[no-any-return]


def test_a_kernel_whose_task_clock_leaves_steal_out() -> None:
    figure = _figure(EXCLUDING_AFTER, own=4.4, seconds=10.0, includes_steal=False)
    assert figure["others_cpu_seconds"] == pytest.approx(0.1) and figure["steal_in_own_time"] is None


def test_a_kernel_whose_task_clock_counts_steal_by_its_configuration() -> None:
    figure = _figure(INCLUDING_AFTER, own=6.62, seconds=10.3, includes_steal=True)
    # busy 5.96 + steal 0.94 = 6.90 charged; others' 0.28 of it, less its share of the steal.
    assert figure["others_cpu_seconds"] == pytest.approx(0.28 * 5.96 / 6.90, abs=1e-3)
    assert figure["steal_in_own_time"] == "the kernel's task clock counts steal"


def test_own_time_above_busy_time_is_observed_steal_whatever_the_configuration_says() -> None:
    for includes_steal in (False, None):
        figure = _figure(INCLUDING_AFTER, own=6.62, seconds=10.3, includes_steal=includes_steal)
        assert isinstance(figure["share"], float) and figure["share"] > -interference.MEASUREMENT_ERROR_SHARE
        assert figure["steal_in_own_time"] == "observed: own CPU time exceeded the CPUs' busy time"


def test_others_never_negative_beyond_the_error_when_own_time_holds_its_steal() -> None:
    """Own time = what it ran + its share of the steal (steal falls on every task alike)."""
    for busy_share in (0.2, 0.5, 0.9):
        for steal_share in (0.0, 0.03, 0.1):
            for others_share in (0.0, 0.01, 0.05):
                capacity = 10.0
                busy = busy_share * capacity
                stolen = steal_share * capacity
                own_ran = busy - others_share * capacity
                own = own_ran + stolen * own_ran / busy
                before = parse_proc_stat(PROC_STAT_BEFORE, 100)[0]
                idle_ticks = round(90100 + (capacity - busy - stolen) * 100)
                steal_ticks = round(1000 + stolen * 100)
                after = f"cpu0 0 0 0 {idle_ticks} 0 0 0 {steal_ticks} 0 0\n" + CPU1
                assert before.idle == pytest.approx(901.0)
                # Told how the clock works, others is exact; not told, it is never below the error.
                told = _figure(after, own=own, seconds=capacity, includes_steal=True)
                assert told["share"] == pytest.approx(others_share, abs=2e-4)
                guessed = _figure(after, own=own, seconds=capacity, includes_steal=None)
                assert guessed["share"] > -interference.MEASUREMENT_ERROR_SHARE


def test_the_kernel_configuration_answers(tmp_path: Path) -> None:
    assert steal_clock.from_kernel_config("CONFIG_PARAVIRT_TIME_ACCOUNTING=y\n").includes_steal is False
    assert steal_clock.from_kernel_config("# CONFIG_PARAVIRT_TIME_ACCOUNTING is not set\n").includes_steal
    assert steal_clock.from_kernel_config(None).includes_steal is None
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_PARAVIRT_TIME_ACCOUNTING=y\n"))
    assert steal_clock.read_kernel_config(root=tmp_path) == "CONFIG_PARAVIRT_TIME_ACCOUNTING=y\n"
    (tmp_path / "proc/config.gz").unlink()
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot/config-6.1.0").write_text("CONFIG_X=y\n")
    assert steal_clock.read_kernel_config("6.1.0", root=tmp_path) == "CONFIG_X=y\n"
    assert steal_clock.read_kernel_config("other", root=tmp_path) is None
