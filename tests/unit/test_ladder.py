"""Ladders and the order of a run: a ladder's rungs, which targets climb which ladder, each rung's rate
from its share of the target's closed-model capacity (or why it is not run), closed rounds before
ladder rounds, and the seeded order inside each round, kept by --resume (the rule in a real session:
tests/integration/test_ladder_session.py)."""

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
from labrunner.results.ladder import closed_capacity, resolve
from labrunner.results.result import parse_results
from labrunner.results.store import MANIFEST_FILE, build_manifest

from tests.support import ALL_TARGETS, ROOT, latency_from_p50, ok_result

MATRIX = ROOT / "matrix.toml"
UNARY = tuple(t for t in ALL_TARGETS if t != "grpc-stream")
# The closed model's req/s on the quarter profile (docs/results.md).
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


def _every_rung(**overrides: Any) -> Plan:
    """The default preset with every rung of both ladders (it runs their lightest and heaviest)."""
    return _default(load_models=("closed", "loaded", "loaded-stream"), **overrides)


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


def test_a_ladder_is_one_open_model_per_share_without_a_rate_until_the_run() -> None:
    models = load_matrix(MATRIX).load_models
    assert "loaded" not in models  # the ladder names its rungs; it is none itself
    rungs = [m for m in models.values() if m.rung is not None]
    assert [m.name for m in rungs] == [
        *(f"loaded-{p}pct" for p in (10, 25, 40)),
        *(f"loaded-stream-{p}pct" for p in (10, 25, 40)),
    ]
    assert {(m.executor, m.rate) for m in rungs} == {("constant-arrival-rate", None)}
    low, high = models["loaded-10pct"], models["loaded-40pct"]
    assert low.rung is not None and high.rung is not None
    assert (low.rung.share, high.rung.share) == (0.1, 0.4)
    assert (low.rung.ladder, low.rung.capacity_model, low.rung.latency_bound_s) == ("loaded", "closed", 0.1)
    assert low.rung.scripts == ("k6/rest.js", "k6/grpc_unary.js")
    # The table's VUs, within which the rate's VUs are chosen when it is set.
    assert (low.pre_allocated_vus, low.max_vus) == (10, 150)
    streams = models["loaded-stream-40pct"]
    assert (streams.pre_allocated_vus, streams.max_vus) == (10, 60)


def _resolved(scenario: Scenario, results: list[dict[str, Any]]) -> Scenario:
    resolved = resolve(scenario, parse_results(results))
    assert isinstance(resolved, Scenario), resolved
    return resolved


@pytest.mark.parametrize(("bound", "vus"), [("10s", 150), ("100ms", 16), ("1ms", 10)])
def test_a_rungs_vus_are_for_its_rate_within_the_tables(bound: str, vus: int) -> None:
    data = tomllib.loads(MATRIX.read_text())
    data["load_models"]["loaded"]["ladder"]["latency_bound"] = bound
    overrides = Overrides(targets=("aiohttp-h1",), load_models=("closed", "loaded-10pct"), repeats=1)
    plan = expand(parse_matrix(data, MATRIX), "local", "default", overrides)
    closed = [_closed_result(_one(plan, "aiohttp-h1.quarter.c100.closed.r1"), 758)]
    model = _resolved(_one(plan, "aiohttp-h1.quarter.c100.loaded-10pct.r1"), closed).load_model
    # 10% of 758 is 76/s: rate x latency_bound x 2, all allocated up front, within 10-150.
    assert (model.rate, model.pre_allocated_vus, model.max_vus) == (76, vus, 150)


def _rungs(plan: Plan) -> dict[str, set[str]]:
    rungs: dict[str, set[str]] = {}
    for s in plan.scenarios:
        if s.load_model.rung is not None:
            rungs.setdefault(s.target.name, set()).add(s.load_model.name)
    return rungs


def test_a_target_climbs_the_ladder_of_its_k6_script() -> None:
    assert _rungs(_every_rung()) == {
        **{target: {"loaded-10pct", "loaded-25pct", "loaded-40pct"} for target in UNARY},
        "grpc-stream": {"loaded-stream-10pct", "loaded-stream-25pct", "loaded-stream-40pct"},
    }
    # The default preset names the ends of each ladder: a tenth and two fifths of the capacity.
    assert _rungs(_default()) == {
        **{target: {"loaded-10pct", "loaded-40pct"} for target in UNARY},
        "grpc-stream": {"loaded-stream-10pct", "loaded-stream-40pct"},
    }


def test_a_ladders_name_selects_its_rungs_and_a_rungs_name_one_and_rate_leaves_them() -> None:
    by_ladder = _default(targets=("grpc",), load_models=("loaded",), repeats=1, rate=7)
    assert [(s.load_model.name, s.load_model.rate) for s in by_ladder.scenarios] == [
        ("loaded-10pct", None),
        ("loaded-25pct", None),
        ("loaded-40pct", None),
    ]
    one = _default(targets=("grpc", "grpc-stream"), load_models=("loaded-25pct", "loaded-stream"), repeats=1)
    assert [s.id for s in one.scenarios] == [
        "grpc.quarter.c100.loaded-25pct.r1",
        "grpc-stream.quarter.c100.loaded-stream-10pct.r1",
        "grpc-stream.quarter.c100.loaded-stream-25pct.r1",
        "grpc-stream.quarter.c100.loaded-stream-40pct.r1",
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


def test_a_rung_runs_at_its_share_of_its_targets_closed_capacity_or_says_why_not() -> None:
    plan = _every_rung(targets=("quart-h2-tls", "grpc", "grpc-stream"))
    closed = [
        _closed_result(_one(plan, "quart-h2-tls.quarter.c100.closed.r1"), 150),
        _closed_result(_one(plan, "quart-h2-tls.quarter.c100.closed.r2"), 96),  # geometric mean 120
        _closed_result(_one(plan, "grpc-stream.quarter.c100.closed.r1"), 2),
        _closed_result(_one(plan, "grpc.quarter.c100.closed.r1"), 500, status="failed"),  # no capacity
    ]
    quart = _one(plan, "quart-h2-tls.quarter.c100.loaded-40pct.r1")
    assert closed_capacity(quart, parse_results(closed)) == pytest.approx(120)
    resolved = _resolved(quart, closed)
    assert resolved.load_model.rate == 48  # 40% of 120
    assert resolved.id == quart.id and resolved.load_model.name == "loaded-40pct"
    # 48/s x 100 ms x 2 is 9.6 VUs: the table's 10 at least.
    assert resolved == replace(quart, load_model=replace(quart.load_model, rate=48, pre_allocated_vus=10))
    # Rounded, and never below 1/s: 10%, 25% and 40% of 2 streams/s.
    streams = [_one(plan, f"grpc-stream.quarter.c100.loaded-stream-{p}pct.r1") for p in (10, 25, 40)]
    assert [_resolved(s, closed).load_model.rate for s in streams] == [1, 1, 1]
    assert (
        resolve(_one(plan, "grpc.quarter.c100.loaded-25pct.r1"), parse_results(closed))
        == "no successful closed-model result of this target in this run to take 25% of"
    )
    not_a_rung = _one(plan, "grpc.quarter.c100.closed.r2")
    assert resolve(not_a_rung, parse_results(closed)) is not_a_rung


def test_a_closed_result_under_other_conditions_is_no_capacity_of_the_rung() -> None:
    plan = _every_rung(targets=("grpc",), counts=(10, 100), repeats=1)
    closed = [_closed_result(_one(plan, "grpc.quarter.c10.closed.r1"), 1000)]
    assert closed_capacity(_one(plan, "grpc.quarter.c100.loaded-25pct.r1"), parse_results(closed)) is None
    c10 = _one(plan, "grpc.quarter.c10.loaded-25pct.r1")
    assert closed_capacity(c10, parse_results(closed)) == pytest.approx(1000)


def test_a_duets_closed_results_count_for_their_target_pooled_with_the_others() -> None:
    """A closed result measured beside a partner has a group of its own (".vs-<partner>") and names
    its target's apart ("target_group"): the rung pools every closed result of its target."""
    plan = _every_rung(targets=("grpc",), repeats=2)
    alone = _closed_result(_one(plan, "grpc.quarter.c100.closed.r1"), 100)
    beside = _closed_result(_one(plan, "grpc.quarter.c100.closed.r2"), 400)
    beside["scenario"] |= {
        "group": "grpc.quarter.c100.closed.vs-aiohttp-h1",
        "target_group": "grpc.quarter.c100.closed",
    }
    aa = copy.deepcopy(beside)
    aa["scenario"] |= {"group": "grpc.quarter.c100.closed.aa1"}
    other = copy.deepcopy(beside)
    other["scenario"] |= {"target_group": "aiohttp-h1.quarter.c100.closed"}
    rung = _one(plan, "grpc.quarter.c100.loaded-25pct.r1")
    mixed = parse_results([alone, beside, other])
    assert closed_capacity(rung, mixed) == pytest.approx(200)  # 100 and 400's mean
    assert closed_capacity(rung, parse_results([beside, aa])) == pytest.approx(400)
    assert _resolved(rung, [alone, beside, other]).load_model.rate == 50  # 25% of 200


def test_the_default_run_gives_every_target_its_two_rungs() -> None:
    """At the quarter profile's capacities every rung the default names runs, each at its share: 16
    rungs of one repeat, a tenth and two fifths of each target's capacity."""
    plan = _default()
    closed = [
        _closed_result(s, QUARTER_CAPACITY[s.target.name])
        for s in plan.scenarios
        if s.load_model.rung is None
    ]
    rungs = [resolve(s, parse_results(closed)) for s in plan.scenarios if s.load_model.rung is not None]
    assert all(isinstance(s, Scenario) for s in rungs)
    assert len(closed) == 24 and len(rungs) == 16 and len(plan.scenarios) == 40
    assert plan.estimated_seconds == 40 * 6  # 5 s windows after a 1 s warm-up
    rates = {(s.target.name, s.load_model.name): s.load_model.rate for s in rungs if isinstance(s, Scenario)}
    assert rates["aiohttp-h1", "loaded-40pct"] == 303  # 40% of 758
    assert rates["quart-h1", "loaded-10pct"] == 24  # 10% of 243
    assert [rates["grpc-stream", f"loaded-stream-{p}pct"] for p in (10, 40)] == [2, 8]


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
        not_run={"grpc.quarter.c100.loaded-25pct.r1": "no successful closed-model result ..."},
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
        "grpc.quarter.c100.loaded-25pct.r1": "no successful closed-model result ..."
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
        ("loaded", {"rate": 50}, r"\[load_models.loaded\]: a ladder's rungs get their own rates"),
        ("open", {"rate": None}, r"\[load_models.open\]: missing key 'rate' \(or a ladder table of shares\)"),
        (
            "loaded/ladder",
            {"shares": [0.5, 0.25]},
            r"\[load_models.loaded\] ladder shares: \[0.5, 0.25\] must rise, each share above the last",
        ),
        (
            "loaded/ladder",
            {"shares": [0.5, 0.5]},
            r"\[load_models.loaded\] ladder shares: \[0.5, 0.5\] must rise",
        ),
        ("loaded/ladder", {"shares": []}, r"ladder shares: must list at least one share"),
        ("loaded/ladder", {"shares": [0.5, 1.5]}, r"ladder shares\[1\]: 1.5 must be a fraction in \(0, 1\]"),
        ("loaded/ladder", {"shares": [0, 0.5]}, r"ladder shares\[0\]: 0.0 must be a fraction in \(0, 1\]"),
        ("loaded/ladder", {"shares": [0.255]}, r"ladder shares\[0\]: 0.255 must be a whole percent"),
        (
            "loaded/ladder",
            {"shares": None, "rates": [100, 450], "max_share": 0.9},
            r"\[load_models.loaded\] ladder: rates became shares: .* e.g. shares = \[0.1, 0.25, 0.4\], "
            "and drop max_share",
        ),
        ("loaded/ladder", {"max_share": 0.9}, r"ladder: rates became shares"),
        ("loaded/ladder", {"capacity_model": "open"}, r"ladder capacity_model: 'open' is not a constant-vus"),
        ("loaded/ladder", {"scripts": []}, r"\[load_models.loaded\] ladder scripts: must list at least one"),
    ],
)
def test_a_ladder_that_cannot_be_is_named(table: str, values: dict[str, object], message: str) -> None:
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_with(table, values), MATRIX)


def test_a_rung_may_not_take_another_load_models_name() -> None:
    data = _with("loaded/ladder", {"shares": [0.15]})
    data["load_models"]["loaded-15pct"] = data["load_models"]["equal-load"]
    with pytest.raises(
        MatrixError, match=r"ladder shares: its rung 'loaded-15pct' is also a \[load_models.\*\] table"
    ):
        parse_matrix(data, MATRIX)
