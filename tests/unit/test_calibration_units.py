"""The two calibration units: the kernel unit's round trips run for real, and a run's units are read back."""

import os
import re

import pytest
from labrunner.run import calibration


def test_the_kernel_unit_answers_real_round_trips_on_the_cpu_clock_of_the_answering_side() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    measured = calibration.measure_kernel(cpus[:1], units_per_round=20, rounds=3)
    # Named apart from the CPU unit's workload, versioned: a kernel unit is never read as a CPU unit.
    assert re.fullmatch(r"protolab\.calibration\.kernel/\d+: .+", measured["workload"]), measured["workload"]
    assert measured["units"] == 60 and measured["peer_cpus"] == cpus[:1]
    # A loopback round trip costs microseconds of CPU, never nothing and never a millisecond.
    assert 1e-7 < measured["cpu_seconds_per_unit"] < 1e-3
    assert measured["median_over_fastest"] >= 1.0
    assert measured["system_share"] is None or 0.0 <= measured["system_share"] <= 1.0


def test_a_run_reads_each_unit_from_its_before_and_after_calibrations() -> None:
    runs = {
        when: {"cpu_seconds_per_unit": cpu, "kernel": {"cpu_seconds_per_unit": kernel}}
        for when, cpu, kernel in (("before", 0.0004, 0.00002), ("after", 0.0006, 0.00004))
    }
    assert calibration.unit_seconds(runs) == pytest.approx(0.0005)
    assert calibration.unit_seconds(runs, "kernel") == pytest.approx(0.00003)
    # A run calibrated before the kernel unit existed has only the CPU unit.
    assert calibration.unit_seconds({"before": {"cpu_seconds_per_unit": 0.0004}}, "kernel") is None
