"""A scenario's finish runs on the session's finisher thread, beside the next scenario: whatever fails
there (the stop, the collect, the writing of its result or of the summaries) is that scenario's own,
reported once on its own line, and the run goes on. And a Ctrl-C while one scenario finishes and the
next starts leaves nothing behind.

The docker backend on the thin fake client (tests/docker_fake.py) with a real HTTP server behind its
published ports, the runner's real threads, real result files; what fails is real where it can be (a
directory where a result file goes) and raised by the fake engine where only an engine could.
"""

import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from docker.errors import DockerException
from labrunner import interrupts
from labrunner.backends.docker import DockerBackend
from labrunner.cli import session
from labrunner.observe import interference, prometheus_sd
from labrunner.results.store import result_path
from labrunner.run import runner

from tests.docker_fake import (
    FakeContainer,
    FakeDocker,
    docker_stats,
    flow_plan,
    k6_writes_its_summary,
    quick_polls_and_compose_defaults,
    records_published,
    run_config,
    settings,
)

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

PLAN = flow_plan(repeats=3)
FIRST, SECOND, THIRD = (s.id for s in PLAN.scenarios)


@pytest.fixture(autouse=True)
def _quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)


@pytest.fixture
def fake() -> Iterator[FakeDocker]:
    """An engine whose k6 writes its summary, each service with usage samples to spare."""
    engine = FakeDocker()
    engine.service_stats = [docker_stats(1.0 + i, 0, 0, 0) for i in range(20)]
    engine.on_k6_start = k6_writes_its_summary
    with records_published(engine):
        yield engine


@pytest.fixture
def finisher_client(fake: FakeDocker) -> FakeDocker:
    """The finisher's own client of the same engine: it sees the same containers."""
    client = FakeDocker()
    client.created, client.removed = fake.created, fake.removed
    return client


def run(tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker) -> tuple[bool, list[str]]:
    """run_plan over three repeats; whether all were ok, and the lines it said."""
    lines: list[str] = []
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None, finisher_client=finisher_client)
    ok = session.run_plan(PLAN, run_config(tmp_path), backend, settings(tmp_path), say=lines.append)
    return ok, lines


def result_lines(lines: list[str]) -> dict[str, list[str]]:
    """Each scenario's result lines ("[i/3] <id>: ok ..." or "FAILED ..."), by scenario."""
    found: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("[") and ": starting" not in line:
            scenario = line.split("] ", 1)[1].split(":", 1)[0]
            found.setdefault(scenario, []).append(line)
    return found


def result(tmp_path: Path, scenario: str) -> dict:
    return json.loads(result_path(tmp_path / "out", scenario).read_text())


def assert_nothing_left(tmp_path: Path, fake: FakeDocker) -> None:
    assert sorted(fake.removed) == sorted(c.name for c in fake.created), "a container was left"
    assert not list((tmp_path / "targets").glob("*.json")), "a Prometheus target file was left"


def test_an_overlapped_finish_runs_on_the_finisher_through_its_own_client(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    ok, lines = run(tmp_path, fake, finisher_client)
    assert ok, lines
    services = [c.name for c in fake.created if c.role == "service"]
    assert len(services) == 3
    assert {fake.stopped_on[name] for name in services} == {"finish_0"}
    assert [name for name in finisher_client.got if name in services] == services
    assert {scenario: len(found) for scenario, found in result_lines(lines).items()} == {
        FIRST: 1,
        SECOND: 1,
        THIRD: 1,
    }
    # The two that overlapped the next one's start say so; the last one had nothing to overlap.
    timings = {s: result(tmp_path, s)["timings_s"] for s in (FIRST, SECOND, THIRD)}
    assert "overlapped" in timings[FIRST] and "overlapped" in timings[SECOND], timings
    assert "overlapped" not in timings[THIRD], timings[THIRD]
    assert_nothing_left(tmp_path, fake)


def test_a_failed_stop_is_its_own_scenarios_and_the_run_goes_on(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    def second_will_not_stop(container: FakeContainer) -> None:
        if container.params["labels"]["protolab.scenario"] == SECOND:
            raise DockerException("the engine lost the container")

    fake.on_stop = second_will_not_stop
    ok, lines = run(tmp_path, fake, finisher_client)
    assert not ok
    assert result(tmp_path, FIRST)["status"] == result(tmp_path, THIRD)["status"] == "ok"
    failure = result(tmp_path, SECOND)["failure"]
    assert (failure["phase"], failure["message"]) == ("stop", "docker: the engine lost the container")
    reported = result_lines(lines)
    assert [len(reported[s]) for s in (FIRST, SECOND, THIRD)] == [1, 1, 1]
    assert "FAILED in stop: docker: the engine lost the container" in reported[SECOND][0]
    assert "FAILED" not in reported[THIRD][0] + reported[FIRST][0]
    assert f"2 of 3 scenarios ok; failed: {SECOND}\nresults:" in "\n".join(lines)
    assert_nothing_left(tmp_path, fake)


def test_a_result_that_cannot_be_written_fails_its_own_scenario_not_the_next(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    blocked = result_path(tmp_path / "out", SECOND)
    blocked.mkdir(parents=True)  # the atomic rename onto it fails, as a full disk would fail it
    ok, lines = run(tmp_path, fake, finisher_client)
    assert not ok
    assert result(tmp_path, FIRST)["status"] == result(tmp_path, THIRD)["status"] == "ok"
    reported = result_lines(lines)
    assert [len(reported[s]) for s in (FIRST, SECOND, THIRD)] == [1, 1, 1]
    second = reported[SECOND][0]
    assert "FAILED in record: its result could not be written: IsADirectoryError" in second, second
    assert f"note: {SECOND}: nor its failure" in second, second
    assert "FAILED" not in reported[THIRD][0]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is False
    assert_nothing_left(tmp_path, fake)


def test_a_collect_that_raises_fails_its_own_scenario_with_its_own_traceback(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = interference.scenario_section

    def fails_for_the_second(window, handle, usage, unmetered):  # type: ignore[no-untyped-def]
        if handle is not None and handle.scenario_id == SECOND:
            raise ValueError("a bug in the collect")
        return section(window, handle, usage, unmetered)

    monkeypatch.setattr(interference, "scenario_section", fails_for_the_second)
    ok, _ = run(tmp_path, fake, finisher_client)
    assert not ok
    failure = result(tmp_path, SECOND)["failure"]
    assert (failure["phase"], failure["message"]) == ("internal", "ValueError: a bug in the collect")
    assert "fails_for_the_second" in failure["log_tail"], failure["log_tail"]
    assert result(tmp_path, FIRST)["status"] == result(tmp_path, THIRD)["status"] == "ok"
    assert_nothing_left(tmp_path, fake)


def test_summaries_that_cannot_be_written_are_noted_and_every_result_is_kept(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    (tmp_path / "out" / "summary.md").mkdir(parents=True)
    ok, lines = run(tmp_path, fake, finisher_client)
    assert ok, lines  # every scenario ran and is written; only the summaries are missing
    assert all(result(tmp_path, s)["status"] == "ok" for s in (FIRST, SECOND, THIRD))
    reported = result_lines(lines)
    assert all(f"note: {s}: summaries not updated (IsADirectoryError" in reported[s][0] for s in reported)
    assert any(line.startswith("summaries not written: IsADirectoryError") for line in lines), lines


def test_ctrl_c_while_one_scenario_finishes_and_the_next_starts_leaves_nothing(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    """Ctrl-C in the second scenario's warm-up, while the first one's stop is still under way."""
    first_stopping, second_started = threading.Event(), threading.Event()

    def first_stops_slowly(container: FakeContainer) -> None:
        if container.params["labels"]["protolab.scenario"] == FIRST:
            first_stopping.set()
            assert second_started.wait(10)

    def interrupted_in_the_second(container: FakeContainer) -> None:
        if container.params["labels"]["protolab.scenario"] == SECOND:
            second_started.set()
            assert first_stopping.wait(10)
            raise KeyboardInterrupt
        k6_writes_its_summary(container)

    fake.on_stop = first_stops_slowly
    fake.on_k6_start = interrupted_in_the_second
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, fake, finisher_client)
    assert result(tmp_path, FIRST)["status"] == "ok"  # the finishing one kept its result
    assert not result_path(tmp_path / "out", SECOND).exists()
    services = [c.params["labels"]["protolab.scenario"] for c in fake.created if c.role == "service"]
    assert services == [FIRST, SECOND]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["all_ok"] is None
    assert_nothing_left(tmp_path, fake)


def test_a_finish_whose_outcome_cannot_be_built_fails_its_own_scenario_and_stops_its_service(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug past the collect, in building the outcome itself: still that scenario's own failure."""
    build = runner.ScenarioRun._outcome

    def fails_for_the_second(self: runner.ScenarioRun, overlapped):  # type: ignore[no-untyped-def]
        if self.scenario.id == SECOND:
            raise ValueError("a bug in the outcome")
        return build(self, overlapped)

    monkeypatch.setattr(runner.ScenarioRun, "_outcome", fails_for_the_second)
    ok, lines = run(tmp_path, fake, finisher_client)
    assert not ok
    failure = result(tmp_path, SECOND)["failure"]
    assert (failure["phase"], failure["message"]) == ("internal", "ValueError: a bug in the outcome")
    assert "fails_for_the_second" in failure["log_tail"], failure["log_tail"]
    assert result(tmp_path, FIRST)["status"] == result(tmp_path, THIRD)["status"] == "ok"
    assert [len(found) for found in result_lines(lines).values()] == [1, 1, 1]
    assert_nothing_left(tmp_path, fake)


def test_a_target_file_that_cannot_be_removed_does_not_keep_the_service_running(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop removes the target file first; when that fails, the service still stops there."""
    unlink, refused = Path.unlink, []

    def refuses_the_seconds_target(path: Path, missing_ok: bool = False) -> None:
        if path.parent == tmp_path / "targets" and SECOND in path.name and not refused:
            refused.append(path)  # once: at the run's end, the target files go
            raise PermissionError("read-only")
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuses_the_seconds_target)
    ok, lines = run(tmp_path, fake, finisher_client)
    assert ok, lines
    second = next(c for c in fake.created if c.params["labels"]["protolab.scenario"] == SECOND)
    assert fake.stopped_on[second.name] == "finish_0"  # stopped by its finish, not by close()
    assert any(f"{SECOND}: its Prometheus target file stays: read-only" in line for line in lines)
    assert_nothing_left(tmp_path, fake)  # the run's end removed the run's target files


def test_a_resumed_run_overlaps_only_what_ran_beside_another(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker
) -> None:
    """The last scenario to run is not overlapped, whichever scenario of the plan it is."""
    ok, _ = run(tmp_path, fake, finisher_client)
    assert ok
    for scenario in (FIRST, SECOND):
        result_path(tmp_path / "out", scenario).unlink()
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None, finisher_client=finisher_client)
    config = replace(run_config(tmp_path), resume=True)
    assert session.run_plan(PLAN, config, backend, settings(tmp_path), say=lambda line: None)
    assert "overlapped" in result(tmp_path, FIRST)["timings_s"]
    assert "overlapped" not in result(tmp_path, SECOND)["timings_s"]


def test_a_first_ctrl_c_during_the_runs_cleanup_waits_until_it_is_done(
    tmp_path: Path, fake: FakeDocker, finisher_client: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the last scenario, a Ctrl-C while the run removes its targets: the cleanup and the
    manifest complete, and only then does the interrupt end the run."""
    delete_run = prometheus_sd.delete_run

    def interrupted_while_deleting(targets_dir: Path, run_id: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs on this (the main) thread, now
        delete_run(targets_dir, run_id)

    monkeypatch.setattr(prometheus_sd, "delete_run", interrupted_while_deleting)
    with pytest.raises(KeyboardInterrupt), interrupts.first_one_ends_the_run():
        run(tmp_path, fake, finisher_client)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["finished_at"], manifest
    assert all(result(tmp_path, s)["status"] == "ok" for s in (FIRST, SECOND, THIRD))
    assert (tmp_path / "out" / "summary.md").exists()
    assert_nothing_left(tmp_path, fake)
