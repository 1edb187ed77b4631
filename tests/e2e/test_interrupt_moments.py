"""Ctrl-C at each moment of a local run (docs/guarantees.md): during a service's start, its warm-up,
an emulated network's measured window and the calibration after the last scenario. Each leaves no
process, no cgroup, no network namespace and no Prometheus target file, and --resume completes the
run. The overlap, a second Ctrl-C during shutdown and the last scenario's finish are in
test_interrupted_runs.py. Each moment is found from what the run shows (its lines, its processes),
never from a sleep."""

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.local_runs import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    FIRST,
    Run,
    assert_nothing_left,
    processes_of,
    quick_benchmark,
    results,
    start_run,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True)
    return {entry["name"] for entry in json.loads(listed.stdout.strip() or "[]")}


def starting(run: Run) -> bool:
    return f"{FIRST}: starting" in run.output()


def warming_up(run: Run) -> bool:
    """k6 runs for the first scenario and has not yet written its warm-up's summary."""
    measuring = any("k6" in line and f"scenario={FIRST}" in line for line in processes_of(run))
    return measuring and not (run.out / "k6" / f"{FIRST}.warmup.json").exists()


def measuring_over_the_link(run: Run) -> bool:
    return any("k6" in line and "scenario=aiohttp-h1." in line for line in processes_of(run))


def after_the_last_scenario(run: Run) -> bool:
    return f"[1/1] {FIRST}: ok" in run.output()


# One scenario, measured for 1 s without warm-up, no InfluxDB and no Prometheus (local_runs.QUIET).
ONE = ("--preset", "ci", "--target", "aiohttp-h1", "--duration", "1s", "--warmup", "0")
# moment -> (when to send the Ctrl-C, the run's extra arguments)
MOMENTS: dict[str, tuple[Callable[[Run], bool], tuple[str, ...]]] = {
    "a service's start": (starting, ()),
    "the warm-up": (warming_up, ("--warmup", "3s")),
    "an emulated network's measured window": (
        measuring_over_the_link,
        ("--network", "lan", "--duration", "2s"),
    ),
    "the calibration after the last scenario": (after_the_last_scenario, ()),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_at_this_moment_leaves_nothing_and_resume_completes(tmp_path: Path, moment: str) -> None:
    when, extra = MOMENTS[moment]
    before = namespaces()
    targets = tmp_path / "targets"
    out = tmp_path / f"moment-{uuid.uuid4().hex[:8]}"  # the run id, which names its cgroups
    quick_benchmark(out)
    args = (*ONE, *extra, "--prometheus-targets", str(targets))
    run = start_run(out, *args)
    wait_until(lambda: when(run), 90, moment)
    os.killpg(run.process.pid, signal.SIGINT)
    assert run.wait(timeout=60) == EXIT_INTERRUPTED, run.output()[-4000:]
    assert_nothing_left(run, timeout=2)
    assert not namespaces() - before, "a network namespace was left"
    assert not list(targets.glob("*.json")), "a Prometheus target file was left"
    assert json.loads((out / "manifest.json").read_text())["finished_at"], "no final manifest"

    resumed = start_run(out, *args, "--resume", marker=run.marker)
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    assert [result["status"] for result in results(out).values()] == ["ok"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert_nothing_left(resumed)
    assert not namespaces() - before
