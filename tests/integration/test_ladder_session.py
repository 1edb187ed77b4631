"""A ladder in a real session: the closed rounds run first, then each rung at its share of the req/s
its target served under the closed model in this run, which k6 is offered and the rung's result
records; a rung without a closed result is said, named in the manifest and summary.md, and no
failure; --resume runs what is left in the order first planned and sets each rung the same.

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

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

NO_CLOSED = "no successful closed-model result of this target in this run to take {:.0%} of"


def _plan(*load_models: str) -> Plan:
    """aiohttp-h1 under the given load models, two repeats; the unary ladder at 50% and 90%."""
    data = copy.deepcopy(tomllib.loads((ROOT / "matrix.toml").read_text()))
    data["load_models"]["loaded"]["ladder"]["shares"] = [0.5, 0.9]
    data["load_models"]["loaded"]["repeats"] = 2
    data["presets"]["default"]["load_models"] = ["closed", "loaded"]  # its own rungs are gone
    overrides = Overrides(
        targets=("aiohttp-h1",), counts=(3,), load_models=load_models, duration="2s", warmup="0", repeats=2
    )
    return expand(parse_matrix(data, ROOT / "matrix.toml"), "docker", "default", overrides)


@pytest.fixture(autouse=True)
def _quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)
    # The CPU calibration around a session is not under test here (it waits out a busy host).
    monkeypatch.setattr("labrunner.run.calibration.calibrate", lambda cpus, when, say, rounds, attempts: {})


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


def _rates(tmp_path: Path, fake: FakeDocker) -> tuple[dict[str, int], list[str]]:
    """Each rung's rate in its result, and the rates its k6 runs were offered (warm-up and measured)."""
    recorded = {}
    for path in (tmp_path / "out" / "scenarios").glob("*.loaded-*.json"):
        result = json.loads(path.read_text())
        recorded[result["scenario_id"]] = result["scenario"]["load_model"]["rate"]
    offered = [c.params["environment"].get("RATE") for c in fake.created if c.role == "k6"]
    return recorded, [rate for rate in offered if rate is not None]


def test_rungs_run_at_their_share_of_the_closed_capacity_in_seeded_order_and_resume_keeps_both(
    tmp_path: Path, fake: FakeDocker
) -> None:
    plan = replace(_plan("closed", "loaded"), seed=11)
    ok, lines = _run(tmp_path, fake, plan)
    assert ok, lines
    order = [s.id for s in plan.run_order]
    assert _said(lines, "starting") == order  # in the seeded order, the closed rounds first
    assert [scenario.split(".")[3] for scenario in order[:2]] == ["closed", "closed"]
    assert _said(lines, "not run") == []
    # 50% and 90% of the 100 req/s served closed: offered to k6, and in each rung's result.
    recorded, offered = _rates(tmp_path, fake)
    rungs = [s.id for s in plan.scenarios if s.load_model.rung is not None]
    assert recorded == {scenario: 50 if ".loaded-50pct." in scenario else 90 for scenario in rungs}
    assert len(rungs) == 4
    assert sorted(offered) == ["50", "50", "90", "90"]  # warm-up 0: one k6 run a rung
    manifest = _manifest(tmp_path)
    assert manifest["not_run"] == {}
    assert manifest["all_ok"] is True
    assert manifest["matrix"]["seed"] == 11
    assert manifest["matrix"]["run_order"] == order

    # Resumed after the last rung's result was lost: the seed from the manifest, the same order; what
    # ran is not run again, and the rung left is set the same from the closed results on disk.
    last = order[-1]
    (tmp_path / "out" / "scenarios" / f"{last}.json").unlink()
    resumed, _ = seed_plan(replace(plan, seed=None), None, tmp_path / "out")
    assert resumed.run_order == plan.run_order
    ok, lines = _run(tmp_path, fake, resumed, resume=True)
    assert ok, lines
    assert _said(lines, "ok in an earlier session") == order[:-1]
    assert _said(lines, "starting") == [last]
    assert _rates(tmp_path, fake)[0] == recorded


def test_without_a_closed_result_no_rung_runs(tmp_path: Path, fake: FakeDocker) -> None:
    plan = _plan("loaded")
    ok, lines = _run(tmp_path, fake, plan)
    assert ok, lines
    assert _said(lines, "starting") == []
    assert _manifest(tmp_path)["not_run"] == {
        s.id: NO_CLOSED.format(s.load_model.rung.share) for s in plan.scenarios if s.load_model.rung
    }
    assert "0 of 4 scenarios ok; 4 not run (summary.md says why)" in "\n".join(lines)
    assert fake.created == []  # nothing was started
