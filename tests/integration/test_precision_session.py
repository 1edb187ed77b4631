"""--precision in a real session: after the planned rounds, rounds of one more repeat of the groups
of every compared pair whose req/s ratio is not yet within the precision, until all are or the
budget would be outlasted; the end of the run and the manifest say which pairs reached it.

The docker backend on the thin fake client (tests/docker_fake.py), as tests/integration/
test_ladder_session.py uses it: each measured k6 run reports the next of its target's request counts.
"""

import copy
import json
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from labrunner.model.matrix import expand, parse_matrix
from labrunner.model.scenario import Overrides, Plan

from tests.docker_fake import (
    FakeContainer,
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

# Requests per 2 s window, repeat by repeat: aiohttp-h1's spread narrows, quart-h1 never varies.
# The ratio's 95% interval reaches ±12.6% at 3 repeats, ±6.4% at 4 and ±4.3% at 5 (Welch, log scale).
REQUESTS = {"aiohttp-h1": [200, 220, 210, 210, 210, 210, 210], "quart-h1": [100] * 7}


def _plan() -> Plan:
    data = copy.deepcopy(tomllib.loads((ROOT / "matrix.toml").read_text()))
    overrides = Overrides(
        targets=("aiohttp-h1", "quart-h1"), counts=(3,), load_models=("closed",), duration="2s", warmup="0",
        repeats=2,
    )  # fmt: skip
    return replace(expand(parse_matrix(data, ROOT / "matrix.toml"), "docker", "default", overrides), seed=3)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)
    monkeypatch.setattr("labrunner.run.calibration.calibrate", lambda cpus, when, say, rounds, attempts: {})


@pytest.fixture
def fake() -> Iterator[FakeDocker]:
    engine = FakeDocker()
    engine.service_stats = [docker_stats(4.0 * i, 0, 0, 0) for i in range(400)]  # all of p1's 2 CPUs
    measured = {target: iter(counts) for target, counts in REQUESTS.items()}

    def k6(container: FakeContainer) -> None:
        command = container.params["command"]
        target = next(arg.split("=", 1)[1] for arg in command if arg.startswith("target="))
        k6_writes_its_summary(container, next(measured[target]))

    engine.on_k6_start = k6
    with records_published(engine):
        yield engine


def _run(tmp_path: Path, fake: FakeDocker, precision: float, budget_s: float) -> list[str]:
    ok, lines = run_session(tmp_path, fake, _plan(), precision=precision, budget_s=budget_s)
    assert ok, lines
    return lines


def _started(lines: list[str]) -> list[str]:
    return [line.split("] ", 1)[1].split(":", 1)[0] for line in lines if ": starting" in line]


def test_rounds_are_added_until_the_ratio_is_within_the_precision(tmp_path: Path, fake: FakeDocker) -> None:
    lines = _run(tmp_path, fake, precision=0.05, budget_s=3600)
    started = _started(lines)
    # Two planned rounds, then three added: both groups of the one pair, once a round.
    assert len(started) == 10 and sorted(s.rsplit(".r", 1)[1] for s in started) == sorted("1122334455")
    assert [line for line in lines if line.startswith("precision: round")] == [
        f"precision: round {n}: one more repeat of the 1 of 1 pairs not yet within ±5% "
        "(an A/A control: within ±2% of 1) that the budget left can bring there"
        for n in (1, 2, 3)
    ]
    [end] = [line for line in lines if line.startswith("precision ±5%")]
    assert (
        end
        == "precision ±5% (95% interval of each compared req/s and CPU/req ratio): 1 of 1 pairs reached it"
    )
    assert any(line.startswith("10 of 10 scenarios ok\n") for line in lines), lines  # the added ones too
    record = json.loads((tmp_path / "out" / "manifest.json").read_text())["precision"]
    assert record["target"] == 0.05 and record["scenarios_added"] == 6
    [pair] = record["pairs"]
    assert pair["pair"] == "aiohttp-h1 vs quart-h1" and pair["reached"] and pair["half_width"] < 0.05


def test_a_round_that_would_outlast_the_budget_is_not_started(tmp_path: Path, fake: FakeDocker) -> None:
    lines = _run(tmp_path, fake, precision=0.05, budget_s=5)
    assert len(_started(lines)) == 4
    assert "precision: round 1 (2 scenarios, 12 s) would outlast --budget" in lines
    [end] = [line for line in lines if line.startswith("precision ±5%")]
    assert end.startswith(
        "precision ±5% (95% interval of each compared req/s and CPU/req ratio): 0 of 1 pairs reached it; "
    )
    assert "; not: aiohttp-h1 vs quart-h1 ±" in end  # two repeats: an interval far wider than ±5%
