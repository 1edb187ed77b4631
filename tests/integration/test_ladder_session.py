"""A ladder in a real session: the closed rounds run first, then each rung runs only under 90% of the
req/s its target served under the closed model in this run; a rung over it, or without a closed
result, is said, named in the manifest and summary.md, and no failure; --resume runs what is left in
the order first planned and judges each rung the same.

The docker backend on the thin fake client (tests/docker_fake.py) with a real HTTP server behind its
published ports: every k6 run reports 200 requests in 2 s, so the closed model's capacity is 100 req/s.
"""

import copy
import json
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from labrunner.cli.run_matrix import seed_plan
from labrunner.model.matrix import expand, parse_matrix
from labrunner.model.scenario import Overrides, Plan

from tests.docker_fake import (
    FakeDocker,
    docker_stats,
    k6_writes_its_summary,
    quick_polls_and_compose_defaults,
    records_published,
    run_session,
)
from tests.support import ROOT

OVER = "450 req/s is over 90% of its 100 req/s closed-model capacity in this run"
NO_CLOSED = "no successful closed-model result of this target in this run to judge {} req/s by"


def _plan(*load_models: str) -> Plan:
    """aiohttp-h1 under the given load models, two repeats; the unary ladder at 50 and 450 req/s."""
    data = copy.deepcopy(tomllib.loads((ROOT / "matrix.toml").read_text()))
    data["load_models"]["loaded"]["ladder"]["rates"] = [50, 450]
    overrides = Overrides(
        targets=("aiohttp-h1",), counts=(3,), load_models=load_models, duration="2s", warmup="0", repeats=2
    )
    return expand(parse_matrix(data, ROOT / "matrix.toml"), "docker", "default", overrides)


@pytest.fixture(autouse=True)
def _quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)
    # The CPU calibration around a session is not under test here (it waits out a busy host).
    monkeypatch.setattr("labrunner.run.calibration.calibrate", lambda cpus, when, say: {})


@pytest.fixture
def fake() -> Iterator[FakeDocker]:
    engine = FakeDocker()
    engine.service_stats = [docker_stats(1.0 + i, 0, 0, 0) for i in range(100)]
    engine.on_k6_start = k6_writes_its_summary
    with records_published(engine):
        yield engine


def _run(tmp_path: Path, fake: FakeDocker, plan: Plan, resume: bool = False) -> tuple[bool, list[str]]:
    return run_session(tmp_path, fake, plan, resume=resume)


def _said(lines: list[str], what: str) -> list[str]:
    """The scenario ids of the lines "[i/n] <id>: <what>...", in the order said."""
    return [line.split("] ", 1)[1].split(":", 1)[0] for line in lines if f": {what}" in line]


def _manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_rungs_run_under_the_closed_models_capacity_in_seeded_order_and_resume_keeps_both(
    tmp_path: Path, fake: FakeDocker
) -> None:
    plan = replace(_plan("closed", "loaded"), seed=11)
    ok, lines = _run(tmp_path, fake, plan)
    assert ok, lines  # a rung not run is no failure
    order = [s.id for s in plan.run_order]
    over = [scenario for scenario in order if ".loaded-450." in scenario]
    ran = [scenario for scenario in order if scenario not in over]
    assert _said(lines, "starting") == ran  # in the seeded order, the closed rounds first
    assert [scenario.split(".")[3] for scenario in ran] == ["closed", "closed", "loaded-50", "loaded-50"]
    assert _said(lines, "not run") == over
    assert f"[{order.index(over[0]) + 1}/6] {over[0]}: not run: {OVER}" in lines
    assert "4 of 6 scenarios ok; 2 not run (summary.md says why)\nresults:" in "\n".join(lines)
    manifest = _manifest(tmp_path)
    assert manifest["not_run"] == dict.fromkeys(over, OVER)
    assert manifest["matrix"]["seed"] == 11
    assert manifest["matrix"]["run_order"] == [s.id for s in plan.run_order]
    assert manifest["all_ok"] is True
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "4 of 4 scenarios ok. 2 not run (see Not run)." in summary
    assert all(f"- `{scenario}`: {OVER}" in summary for scenario in over)
    assert not (tmp_path / "out" / "scenarios" / f"{over[0]}.json").exists()

    # Resumed: the seed from the manifest, the same order; what ran is not run again, and the rungs
    # over capacity are judged the same from the results on disk.
    resumed, _ = seed_plan(replace(plan, seed=None), None, tmp_path / "out")
    assert resumed.run_order == plan.run_order
    ok, lines = _run(tmp_path, fake, resumed, resume=True)
    assert ok, lines
    assert _said(lines, "ok in an earlier session") == ran
    assert _said(lines, "not run") == over
    assert _manifest(tmp_path)["not_run"] == dict.fromkeys(over, OVER)


def test_without_a_closed_result_no_rung_runs(tmp_path: Path, fake: FakeDocker) -> None:
    plan = _plan("loaded")
    ok, lines = _run(tmp_path, fake, plan)
    assert ok, lines
    assert _said(lines, "starting") == []
    assert _manifest(tmp_path)["not_run"] == {
        s.id: NO_CLOSED.format(s.load_model.rate) for s in plan.scenarios
    }
    assert "0 of 4 scenarios ok; 4 not run (summary.md says why)" in "\n".join(lines)
    assert fake.created == []  # nothing was started
