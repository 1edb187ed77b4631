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

pytestmark = [pytest.mark.timeout(240), pytest.mark.paired]  # runs interrupted and resumed: no figure judged


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
    # The default rounds (about 2.5 s), not the tests' quick ones: a window the polls cannot miss.
    "the calibration after the last scenario": (after_the_last_scenario, ("--calibration-rounds", "40")),
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


def two_k6_at_once(run: Run) -> bool:
    """A duet block's measured window: both sides' k6 run (a warm-up would be one at a time)."""
    return sum("k6" in line and "scenario=" in line for line in processes_of(run)) >= 2


# aiohttp-h1 and grpc at a quarter CPU each, which fit beside each other on one service CPU: the A/A
# control (aiohttp-h1 beside itself) and the gRPC vs REST pair, one block each, measured for 2 s; with
# the speed reference beside them (run.speed_reference), which the Ctrl-C must not leave behind either.
DUET = (
    *("--preset", "ci", "--profile", "quarter", "--target", "aiohttp-h1,grpc", "--duration", "2s"),
    *("--speed-reference", "on"),
)
DUET_SCENARIOS = {
    "aiohttp-h1.quarter.c100.closed.aa1.r1",
    "aiohttp-h1.quarter.c100.closed.aa2.r1",
    "grpc.quarter.c100.closed.vs-aiohttp-h1.r1",
    "aiohttp-h1.quarter.c100.closed.vs-grpc.r1",
}


def test_ctrl_c_in_a_duets_window_leaves_nothing_and_resume_completes_the_duet_run(tmp_path: Path) -> None:
    out = tmp_path / f"duet-{uuid.uuid4().hex[:8]}"
    quick_benchmark(out)
    run = start_run(out, *DUET, "--duet", "on", "--warmup", "0")
    wait_until(lambda: two_k6_at_once(run), 90, "a duet's measured window")
    os.killpg(run.process.pid, signal.SIGINT)
    assert run.wait(timeout=60) == EXIT_INTERRUPTED, run.output()[-4000:]
    assert_nothing_left(run, timeout=2)
    assert json.loads((out / "manifest.json").read_text())["finished_at"], "no final manifest"

    resumed = start_run(out, *DUET, "--duet", "on", "--warmup", "0", "--resume", marker=run.marker)
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    found = results(out)
    assert set(found) == DUET_SCENARIOS and {r["status"] for r in found.values()} == {"ok"}
    # The speed reference ran beside every measured window, and its counter file is gone with it.
    assert all(r["host"]["speed_reference"]["units"] > 0 for r in found.values())
    assert not list((out / "logs").glob("*.speed-reference"))
    # Each side of a block names its partner, side and slot; the block's two sides ran at once.
    pair = (
        found["grpc.quarter.c100.closed.vs-aiohttp-h1.r1"],
        found["aiohttp-h1.quarter.c100.closed.vs-grpc.r1"],
    )
    assert [r["scenario"]["duet"]["partner"] for r in pair] == ["aiohttp-h1", "grpc"]
    assert sorted(r["scenario"]["duet"]["slot"] for r in pair) == [1, 2]
    assert pair[0]["scenario"]["target_group"] == "grpc.quarter.c100.closed"
    # Each side's k6 is judged with its partner's k6 beside it on k6's CPUs.
    for r, partner in (pair, reversed(pair)):
        assert r["k6"]["beside_cpu_seconds"] == partner["k6"]["cpu_seconds"]
    # Each comparison, or the line that says why there is none: a side whose k6 took more than 80% of
    # its CPUs is a lower bound and enters no ratio (k6 at 89% beside a third test, once).
    summary = (out / "summary.md").read_text()
    for comparison, sides in (
        ("A/A control aiohttp-h1", ("aiohttp-h1", "aiohttp-h1")),
        ("grpc vs aiohttp-h1", ("grpc", "aiohttp-h1")),
    ):
        bounds = [
            f"- {side} (quarter, 100 records, beside {partner}): throughput only a lower bound"
            for side, partner in (sides, sides[::-1])
        ]
        assert f"{comparison}: req/s" in summary or any(b in summary for b in bounds), summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert_nothing_left(resumed)
