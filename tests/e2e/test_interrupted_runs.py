"""run_matrix.py --backend local under interruption and failure, as a subprocess: Ctrl-C (SIGINT to
its process group) and SIGKILL in the middle of a scenario, then --resume; and scenarios whose
service does not start, never becomes healthy, or crashes while measured."""

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.local_runs import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    FIRST,
    SECOND,
    SELECTION,
    Run,
    assert_nothing_left,
    cgroups_of,
    k6_measuring,
    metrics_dirs_of,
    processes_of,
    quick_benchmark,
    read_file,
    results,
    start_run,
    summary_rows,
    wait_until,
)
from tests.support import AFTER_SLOW, ROOT, SLOW, SLOW_STOP_TARGETS, slow_stop_seed

pytestmark = [pytest.mark.timeout(240), pytest.mark.paired]  # runs interrupted and resumed: no figure judged


# What summary.csv says of the selection run start to end: an interrupted and resumed run must say the same.
UNINTERRUPTED_ROWS = {(FIRST, "ok", "aiohttp-h1"), (SECOND, "ok", "grpc")}


def test_ctrl_c_mid_matrix_keeps_what_is_done_and_resume_finishes_it(tmp_path: Path) -> None:
    out = tmp_path / "interrupted"
    run = start_run(out, *SELECTION)
    wait_until((out / "scenarios" / f"{FIRST}.json").exists, 60, "the first scenario's result")
    wait_until(lambda: k6_measuring(run, SECOND), 60, "k6 measuring the second scenario")
    time.sleep(0.3)
    os.killpg(run.process.pid, signal.SIGINT)  # what a Ctrl-C in the terminal sends
    assert run.wait(timeout=60) == EXIT_INTERRUPTED, run.output()[-4000:]
    assert f"--resume --run-id {run.run_id}" in run.output()
    assert_nothing_left(run, timeout=2)

    done = results(out)
    assert set(done) == {FIRST} and done[FIRST]["status"] == "ok", done.keys()
    first_result = (out / "scenarios" / f"{FIRST}.json").read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["all_ok"] is None

    quick_benchmark(out)
    resumed = start_run(out, *SELECTION, "--resume")
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    assert f"{FIRST}: ok in an earlier session, skipped" in resumed.output()
    assert (out / "scenarios" / f"{FIRST}.json").read_bytes() == first_result, "a finished result was rerun"
    assert set(results(out)) == {FIRST, SECOND}
    assert summary_rows(out) == UNINTERRUPTED_ROWS
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert len(manifest["resumed_at"]) == 1
    assert_nothing_left(resumed)


def test_sigkill_mid_scenario_leaves_no_partial_result_and_resume_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    run = start_run(out, *SELECTION)
    wait_until(lambda: k6_measuring(run, SECOND), 90, "k6 measuring the second scenario")
    time.sleep(0.3)
    run.process.kill()  # the runner alone, with no chance to stop its service or k6
    run.wait(timeout=10)

    done = results(out)  # parses every file: atomic writes leave no half-written result
    assert set(done) == {FIRST}, done.keys()
    assert not [p.name for p in (out / "scenarios").iterdir() if p.suffix != ".json"], "temporary files left"
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    # The kernel stops what the runner started (PR_SET_PDEATHSIG): k6 at once, the service after
    # its drain; only the scenario's cgroup, an empty directory, waits for the next session.
    wait_until(lambda: not processes_of(run), 15, "the killed runner's service and k6 to stop")
    assert cgroups_of(run), "the killed scenario's cgroup should be left for resume to remove"
    assert metrics_dirs_of(run), "the killed scenario's metrics directory should be left for resume to remove"

    quick_benchmark(out)
    resumed = start_run(out, *SELECTION, "--resume", marker=run.marker)
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    assert summary_rows(out) == UNINTERRUPTED_ROWS
    assert_nothing_left(resumed)


FAULT_TARGETS = """
# Faults for tests/test_interrupted_runs.py.
[targets.aiohttp-bad-env]
service = "rest_aiohttp"
script = "k6/rest.js"
protocol = "http1.1"
tls = false
expect_proto = "HTTP/1.1"
env = { MAX_COUNT = "abc" }

# An HTTP/1.1 server run for a gRPC target: the runner's gRPC health check never gets SERVING.
[targets.aiohttp-never-healthy]
service = "grpc_aio"
module = "services.rest_aiohttp"
script = "k6/grpc_unary.js"
protocol = "grpc"
tls = false

[presets.faults]
targets = ["aiohttp-bad-env", "aiohttp-never-healthy", "aiohttp-h1", "grpc"]
profiles = ["small"]
duration = "3s"
warmup = "0"
start_timeout = "4s"
"""
CRASHED = "aiohttp-h1.small.c100.closed.r1"


def kill_workers_when_measuring(run: Run, scenario: str) -> None:
    """SIGKILL the service's workers (not its supervisor) a second into its measured k6 run."""
    wait_until(lambda: k6_measuring(run, scenario), 90, f"k6 measuring {scenario}")
    time.sleep(1.0)
    cgroup = next(
        path for path in cgroups_of(run) if path.name.endswith(scenario) and (path / "tasks").exists()
    )
    pids = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    workers = [
        pid for pid in pids if int(read_file(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[1].split()[1]) in pids
    ]
    assert workers, pids
    for pid in workers:
        os.kill(pid, signal.SIGKILL)


def test_failed_scenarios_are_recorded_with_their_log_and_the_matrix_goes_on(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text() + FAULT_TARGETS)
    out = tmp_path / "faults"
    quick_benchmark(out)
    run = start_run(out, "--matrix", str(matrix), "--preset", "faults")
    kill_workers_when_measuring(run, CRASHED)
    assert run.wait() == EXIT_FAILED, run.output()[-4000:]
    assert_nothing_left(run)

    by_target = {r["scenario"]["target"]: r for r in results(out).values()}
    assert set(by_target) == {"aiohttp-bad-env", "aiohttp-never-healthy", "aiohttp-h1", "grpc"}

    bad_env = by_target["aiohttp-bad-env"]["failure"]
    assert bad_env["phase"] == "start", bad_env
    assert "services.rest_aiohttp" in bad_env["message"]
    assert "MAX_COUNT='abc' is not an integer" in bad_env["log_tail"]

    never_healthy = by_target["aiohttp-never-healthy"]["failure"]
    assert never_healthy["phase"] == "health", never_healthy
    assert "not SERVING after 4s" in never_healthy["message"]
    # The service's own log says why: it saw the gRPC client's HTTP/2 preface.
    assert "Pause on PRI/Upgrade" in never_healthy["log_tail"]

    crashed = by_target["aiohttp-h1"]
    assert crashed["status"] == "failed" and crashed["failure"]["phase"] == "measure", crashed["failure"]
    assert crashed["service"]["usage"]["exit_code"] not in (0, None), crashed["service"]["usage"]
    assert "died unexpectedly" in crashed["service"]["log_tail"]

    assert by_target["grpc"]["status"] == "ok", by_target["grpc"]["failure"]
    assert {row[1] for row in summary_rows(out)} == {"ok", "failed"}
    output = run.output()
    assert output.count("FAILED in ") == 3 and "1 of 4 scenarios ok" in output, output[-4000:]


# A first scenario whose stop takes about 3 s (its drain, which the runner otherwise sets to 0): the
# window in which it finishes while the next scenario starts is long enough to be hit from the
# progress lines.


def slow_stop_run(tmp_path: Path, *args: str) -> tuple[Run, Path]:
    """The slow-stop preset, with a Prometheus target directory to check is emptied."""
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text() + SLOW_STOP_TARGETS)
    targets = tmp_path / "targets"
    # The run id names its cgroups and metrics directories: the two tests of this preset run the same
    # scenarios, and beside each other in the paired phase they removed each other's cgroups.
    out = tmp_path / f"slow-stop-{uuid.uuid4().hex[:8]}"
    quick_benchmark(out)
    selection = (
        "--matrix", str(matrix), "--preset", "slow-stop", "--prometheus-targets", str(targets),
        "--seed", slow_stop_seed(),
    )  # fmt: skip
    return start_run(out, *selection, *args), targets


def resume_completes(tmp_path: Path, run: Run) -> None:
    """--resume runs what is missing, and the run is then complete and ok."""
    matrix = tmp_path / "matrix.toml"
    selection = ("--matrix", str(matrix), "--preset", "slow-stop", "--resume")
    resumed = start_run(run.out, *selection, marker=run.marker)
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    assert set(results(run.out)) == {SLOW, AFTER_SLOW}
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert_nothing_left(resumed)


def test_ctrl_c_while_one_scenario_finishes_and_the_next_starts_then_again_during_shutdown(
    tmp_path: Path,
) -> None:
    run, targets = slow_stop_run(tmp_path)
    # The overlap window: the second scenario has started, the first one's result is not yet said.
    wait_until(lambda: f"[2/2] {AFTER_SLOW}: starting" in run.output(), 90, "the second scenario's start")
    assert f"[1/2] {SLOW}: ok" not in run.output(), "the first scenario finished before the window"
    os.killpg(run.process.pid, signal.SIGINT)
    # A second Ctrl-C while the run stops: the first scenario's stop is still in its drain.
    wait_until(lambda: "SIGINT: stopping what the run started" in run.output(), 10, "the interrupt said")
    os.killpg(run.process.pid, signal.SIGINT)
    assert run.wait(timeout=60) == EXIT_INTERRUPTED, run.output()[-4000:]
    output = run.output()
    assert "SIGINT again: still stopping" in output, output[-4000:]
    assert f"[1/2] {SLOW}: ok" in output, output[-4000:]  # its finish completed, and was reported
    assert_nothing_left(run, timeout=2)
    assert not list(targets.glob("*.json")), "a Prometheus target file was left"
    assert set(results(run.out)) == {SLOW} and results(run.out)[SLOW]["status"] == "ok"
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["all_ok"] is None
    resume_completes(tmp_path, run)


def test_ctrl_c_during_the_last_scenarios_finish_stops_it_and_resume_completes(tmp_path: Path) -> None:
    run, targets = slow_stop_run(tmp_path, "--target", "aiohttp-slow-stop")
    # Its finish has begun once its service says it drains (about 3 s): k6's exit alone is not
    # enough, as the runner reads k6's summary before it hands the scenario to its finish.
    service_log = run.out / "logs" / f"{SLOW}.service.log"
    wait_until(lambda: "stopping: draining" in read_file(service_log), 90, "the scenario's stop")
    os.killpg(run.process.pid, signal.SIGINT)
    assert run.wait(timeout=60) == EXIT_INTERRUPTED, run.output()[-4000:]
    assert_nothing_left(run, timeout=2)
    assert not list(targets.glob("*.json")), "a Prometheus target file was left"
    assert json.loads((run.out / "manifest.json").read_text())["complete"] is False
    # Its result is written (the finish on the finisher thread completed): resume has nothing to
    # run but the calibration after it.
    assert results(run.out)[SLOW]["status"] == "ok"
    resumed = start_run(run.out, "--matrix", str(tmp_path / "matrix.toml"), "--preset", "slow-stop",
                        "--target", "aiohttp-slow-stop", "--resume", marker=run.marker)  # fmt: skip
    assert resumed.wait() == EXIT_OK, resumed.output()[-4000:]
    assert f"{SLOW}: ok in an earlier session, skipped" in resumed.output()
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert_nothing_left(resumed)
