"""Ladders and the order of a run: a ladder's rungs, which targets climb which ladder, the capacity rule
that decides whether a rung runs, closed rounds before ladder rounds, and the seeded order inside each
round, kept by --resume (the rule in a real session: tests/integration/test_ladder_session.py)."""

import copy
import tomllib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from labrunner.cli import run_matrix as cli
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import Overrides, Plan, Scenario, round_of
from labrunner.model.schema import MatrixError
from labrunner.results.ladder import closed_capacity, not_run_reason
from labrunner.results.store import MANIFEST_FILE, build_manifest

from tests.support import ALL_TARGETS, ROOT, latency_from_p50, ok_result

MATRIX = ROOT / "matrix.toml"
UNARY = tuple(t for t in ALL_TARGETS if t != "grpc-stream")
# The closed model's req/s on the quarter profile (docs/results.md): the figures matrix.toml's
# ladder rates come from.
QUARTER_CAPACITY = {
    "aiohttp-h1": 758,
    "aiohttp-h1-tls": 682,
    "quart-h1": 243,
    "quart-h1-tls": 219,
    "quart-h2-tls": 150,
    "grpc": 288,
    "grpc-tls": 271,
    "grpc-stream": 20,
}


def _default(**overrides: Any) -> Plan:
    return expand(load_matrix(MATRIX), "local", "default", Overrides(**overrides))


def _closed_result(scenario: Scenario, rps: float, status: str = "ok") -> dict[str, Any]:
    result = ok_result(
        scenario,
        requests=int(rps * 10),
        rps=rps,
        latency_ms=latency_from_p50(2.0),
        received_bytes=1000,
        window_s=10.0,
        cpu_seconds=2.4,
        quota_used=0.95,
    )
    return result | {"status": status}


def _one(plan: Plan, scenario_id: str) -> Scenario:
    return next(s for s in plan.scenarios if s.id == scenario_id)


def test_a_ladder_is_one_open_model_per_rate_with_vus_for_its_rate() -> None:
    models = load_matrix(MATRIX).load_models
    assert "loaded" not in models  # the ladder names its rungs; it is none itself
    low, high, streams = models["loaded-100"], models["loaded-450"], models["loaded-stream-15"]
    assert {m.executor for m in (low, high, streams)} == {"constant-arrival-rate"}
    assert (low.rate, high.rate, streams.rate) == (100, 450, 15)
    assert low.rung == high.rung and low.rung is not None
    assert (low.rung.ladder, low.rung.max_share, low.rung.capacity_model) == ("loaded", 0.9, "closed")
    assert low.rung.scripts == ("k6/rest.js", "k6/grpc_unary.js")
    # rate x latency_bound x 2, all allocated up front, within the table's VUs.
    assert (low.pre_allocated_vus, low.max_vus) == (20, 150)
    assert (high.pre_allocated_vus, high.max_vus) == (90, 150)
    assert (streams.pre_allocated_vus, streams.max_vus) == (30, 60)
    assert models["loaded-stream-5"].pre_allocated_vus == 10


@pytest.mark.parametrize(("bound", "vus"), [("10s", 150), ("1ms", 10)])
def test_a_rungs_vus_stay_within_the_tables(bound: str, vus: int) -> None:
    data = tomllib.loads(MATRIX.read_text())
    data["load_models"]["loaded"]["ladder"]["latency_bound"] = bound
    assert parse_matrix(data, MATRIX).load_models["loaded-100"].pre_allocated_vus == vus


def test_a_target_climbs_the_ladder_of_its_k6_script() -> None:
    rungs: dict[str, set[str]] = {}
    for s in _default().scenarios:
        if s.load_model.rung is not None:
            rungs.setdefault(s.target.name, set()).add(s.load_model.name)
    assert rungs == {
        **{target: {"loaded-100", "loaded-450"} for target in UNARY},
        "grpc-stream": {"loaded-stream-5", "loaded-stream-15"},
    }


def test_a_ladders_name_selects_its_rungs_and_a_rungs_name_one_and_rate_leaves_them() -> None:
    by_ladder = _default(targets=("grpc",), load_models=("loaded",), repeats=1, rate=7)
    assert [(s.load_model.name, s.load_model.rate) for s in by_ladder.scenarios] == [
        ("loaded-100", 100),
        ("loaded-450", 450),
    ]
    one = _default(targets=("grpc", "grpc-stream"), load_models=("loaded-450", "loaded-stream"), repeats=1)
    assert [s.id for s in one.scenarios] == [
        "grpc.quarter.c100.loaded-450.r1",
        "grpc-stream.quarter.c100.loaded-stream-5.r1",
        "grpc-stream.quarter.c100.loaded-stream-15.r1",
    ]


def test_every_closed_round_runs_before_the_first_ladder_round() -> None:
    plan = _default(load_models=("loaded", "closed"), repeats=3)
    for seed in (None, 1, 2, 3):
        order = replace(plan, seed=seed).run_order
        rungs = [s.load_model.rung is not None for s in order]
        assert rungs == sorted(rungs), seed  # every closed scenario, then every rung
        assert [round_of(s) for s in order] == sorted(round_of(s) for s in order), seed
    # Named first, the ladder still runs after: one closed round per repeat, each of every target.
    assert [round_of(s) for s in plan.scenarios[: 3 * len(ALL_TARGETS) : len(ALL_TARGETS)]] == [
        (False, 1),
        (False, 2),
        (False, 3),
    ]


def test_the_same_seed_gives_the_same_order_and_another_seed_another() -> None:
    plan = _default()
    first, again, other = (replace(plan, seed=seed).run_order for seed in (1, 1, 2))
    assert first == again
    assert first != other
    assert first != plan.scenarios  # shuffled
    assert replace(plan, seed=None).run_order == plan.scenarios  # no seed: the matrix's order
    # Each round holds the same scenarios whatever the seed: only the order inside it changes.
    for order in (first, other):
        rounds: dict[tuple[bool, int], set[str]] = {}
        for s in order:
            rounds.setdefault(round_of(s), set()).add(s.id)
        matrix_rounds: dict[tuple[bool, int], set[str]] = {}
        for s in plan.scenarios:
            matrix_rounds.setdefault(round_of(s), set()).add(s.id)
        assert rounds == matrix_rounds
    # The first scenario after calibration is not always the same one.
    assert len({replace(plan, seed=seed).run_order[0].target.name for seed in range(20)}) > 1


def test_a_rung_runs_only_under_its_share_of_the_closed_models_capacity() -> None:
    plan = _default(targets=("quart-h2-tls", "grpc", "grpc-stream"))
    closed = [
        _closed_result(_one(plan, "quart-h2-tls.quarter.c100.closed.r1"), 150),
        _closed_result(_one(plan, "quart-h2-tls.quarter.c100.closed.r2"), 96),  # geometric mean 120
        _closed_result(_one(plan, "grpc-stream.quarter.c100.closed.r1"), 12),
        _closed_result(_one(plan, "grpc.quarter.c100.closed.r1"), 500, status="failed"),  # no capacity
    ]
    quart_low = _one(plan, "quart-h2-tls.quarter.c100.loaded-100.r1")
    assert closed_capacity(quart_low, closed) == pytest.approx(120)
    assert not_run_reason(quart_low, closed) is None  # 100 <= 0.9 x 120
    assert (
        not_run_reason(_one(plan, "quart-h2-tls.quarter.c100.loaded-450.r2"), closed)
        == "450 req/s is over 90% of its 120 req/s closed-model capacity in this run"
    )
    assert (
        not_run_reason(_one(plan, "grpc-stream.quarter.c100.loaded-stream-15.r1"), closed)
        == "15 req/s is over 90% of its 12 req/s closed-model capacity in this run"
    )
    assert not_run_reason(_one(plan, "grpc-stream.quarter.c100.loaded-stream-5.r1"), closed) is None
    assert (
        not_run_reason(_one(plan, "grpc.quarter.c100.loaded-100.r1"), closed)
        == "no successful closed-model result of this target in this run to judge 100 req/s by"
    )
    assert not_run_reason(_one(plan, "grpc.quarter.c100.closed.r2"), closed) is None  # no rung


def test_a_closed_result_under_other_conditions_is_no_capacity_of_the_rung() -> None:
    plan = _default(targets=("grpc",), counts=(10, 100), repeats=1)
    closed = [_closed_result(_one(plan, "grpc.quarter.c10.closed.r1"), 1000)]
    assert closed_capacity(_one(plan, "grpc.quarter.c100.loaded-100.r1"), closed) is None
    assert closed_capacity(_one(plan, "grpc.quarter.c10.loaded-100.r1"), closed) == pytest.approx(1000)


def test_the_default_run_at_the_quarter_profiles_capacities() -> None:
    """The rungs that run at the figures matrix.toml's rates come from, and the k6 time they make:
    near the 9 min 43 s the default run took before the ladders (README)."""
    plan = _default()
    closed = [
        _closed_result(s, QUARTER_CAPACITY[s.target.name])
        for s in plan.scenarios
        if s.load_model.rung is None
    ]
    run = [s for s in plan.scenarios if not_run_reason(s, closed) is None]
    assert {s.id for s in run if s.load_model.name == "loaded-450"} == {
        f"{target}.quarter.c100.loaded-450.r{repeat}"
        for target in ("aiohttp-h1", "aiohttp-h1-tls")
        for repeat in (1, 2)
    }
    assert len(run) == 46 and len(plan.scenarios) == 56  # 24 closed, then the ladders: 22 of 32 rungs
    assert sum(s.warmup_s + s.measured_seconds for s in run) == 46 * 13  # about 10 min of k6
    # The top rung every unary target shares loads the slowest at 50-85% of its capacity.
    shared = max(
        rate
        for rate in {s.load_model.rate or 0 for s in run if s.target.name in UNARY and s.load_model.rung}
        if all(any(s.load_model.rate == rate and s.target.name == target for s in run) for target in UNARY)
    )
    assert 0.5 <= shared / min(QUARTER_CAPACITY[t] for t in UNARY) <= 0.85


def _manifest_of(plan: Plan) -> dict[str, Any]:
    return build_manifest(
        run_id="r1",
        plan=plan,
        backend={"name": "local", "reason": "test"},
        provenance={},
        argv=("run_matrix.py",),
        started_at=datetime.now(UTC),
        finished_at=None,
        complete=False,
        all_ok=None,
        settings={},
        not_run={"grpc.quarter.c100.loaded-450.r1": "450 req/s is over 90% of its 288 req/s ..."},
    )


def test_the_manifest_keeps_the_seed_and_resume_runs_in_its_order(tmp_path: Path) -> None:
    plan = _default()
    planned = replace(plan, seed=42)
    manifest = _manifest_of(planned)
    assert manifest["matrix"]["seed"] == 42
    assert manifest["matrix"]["run_order"] == [s.id for s in planned.run_order]
    # The report reads the matrix's order, whatever the seed.
    assert [s["id"] for s in manifest["matrix"]["scenarios"]] == [s.id for s in plan.scenarios]
    assert manifest["not_run"] == {
        "grpc.quarter.c100.loaded-450.r1": "450 req/s is over 90% of its 288 req/s ..."
    }
    write_json_atomic(tmp_path / MANIFEST_FILE, manifest)
    resumed, origin = cli.seed_plan(plan, None, tmp_path)
    assert (resumed.seed, origin) == (42, "the run's, from its manifest")
    assert [s.id for s in resumed.run_order] == manifest["matrix"]["run_order"]
    # A new run takes --seed, or a fresh one; only a resumed run reads the manifest.
    assert cli.seed_plan(plan, 7, None)[0].seed == 7
    assert cli.seed_plan(plan, None, tmp_path / "elsewhere")[0].seed is not None


def test_resume_refuses_another_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json_atomic(tmp_path / MANIFEST_FILE, _manifest_of(replace(_default(), seed=42)))
    arguments = [
        "--backend",
        "local",
        "--out",
        str(tmp_path),
        "--resume",
        "--seed",
        "7",
        "--influxdb",
        "none",
    ]
    assert cli.main(arguments) == cli.EXIT_USAGE
    assert "--seed 7: the run to resume was planned with seed 42" in capsys.readouterr().err


def _with(table: str, values: dict[str, object]) -> dict[str, Any]:
    """matrix.toml with the values set in a load model's table (None: the key left out)."""
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    node = data["load_models"]
    for part in table.split("/"):
        node = node[part]
    for key, value in values.items():
        if value is None:
            del node[key]
        else:
            node[key] = value
    return data


@pytest.mark.parametrize(
    ("table", "values", "message"),
    [
        ("loaded", {"rate": 50}, r"\[load_models.loaded\]: a ladder's rungs have their own rates"),
        ("open", {"rate": None}, r"\[load_models.open\]: missing key 'rate' \(or a ladder table of rates\)"),
        (
            "loaded/ladder",
            {"rates": [100, 100]},
            r"\[load_models.loaded\] ladder rates: \[100, 100\] lists a rate twice",
        ),
        ("loaded/ladder", {"rates": []}, r"\[load_models.loaded\] ladder rates: must list at least one rate"),
        (
            "loaded/ladder",
            {"max_share": 1.5},
            r"\[load_models.loaded\] ladder max_share: 1.5 must be a fraction",
        ),
        ("loaded/ladder", {"capacity_model": "open"}, r"ladder capacity_model: 'open' is not a constant-vus"),
        ("loaded/ladder", {"scripts": []}, r"\[load_models.loaded\] ladder scripts: must list at least one"),
    ],
)
def test_a_ladder_that_cannot_be_is_named(table: str, values: dict[str, object], message: str) -> None:
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_with(table, values), MATRIX)


def test_a_rung_may_not_take_another_load_models_name() -> None:
    data = _with("loaded/ladder", {"rates": [15]})
    data["load_models"]["loaded-15"] = data["load_models"]["equal-load"]
    with pytest.raises(
        MatrixError, match=r"ladder rates: its rung 'loaded-15' is also a \[load_models.\*\] table"
    ):
        parse_matrix(data, MATRIX)
