"""Numbers that can carry a decision: lower bounds enter no ratio, summary.md gives every group
its interval, build is compared with prebuilt, and the interpreter build is recorded and chosen."""

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report.compare import budget_pairs, compare_groups, group_results
from labrunner.report.repeats import across_repeats_markdown
from labrunner.results.result import parse_result, parse_results
from labrunner.results.store import scenario_dict
from labrunner.results.trust import verdict_of

from services.common import interpreter
from tests.support import ROOT


def _scenarios(
    targets: tuple[str, ...], repeats: int, models: tuple[str, ...] = ("build",)
) -> tuple[Scenario, ...]:
    overrides = Overrides(targets=targets, profiles=("quarter",), repeats=repeats, response_models=models)
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios


def _result(scenario: Scenario, rps: float, k6_cpu: float = 0.4, service_cpu: float = 0.95) -> dict[str, Any]:
    requests = int(rps * 3)
    return {
        "scenario_id": scenario.id,
        "status": "ok",
        "scenario": scenario_dict(scenario),
        "k6": {
            "cpu_utilisation": k6_cpu,
            "metrics": {
                "requests": requests,
                "requests_per_second": rps,
                "errors": 0,
                "latency_ms": {"avg": 2.0, "p50": 1.5, "p90": 3.0, "p95": 3.5, "p99": 5.0},
                "data_received_bytes": requests * 1000,
                "test_run_seconds": 3.0,
            },
        },
        "service": {"usage": {"cpu_seconds": 0.7, "cpu_utilisation": service_cpu}},
        "suspect": [],
    }


def test_a_k6_bound_group_is_a_lower_bound_that_enters_no_ratio() -> None:
    scenarios = _scenarios(("aiohttp-h1", "quart-h1", "grpc"), repeats=3)
    # aiohttp outruns k6 (k6 at 90% of its CPU); quart and grpc keep the service busy.
    results = [
        _result(s, 500.0 + s.repeat, k6_cpu=0.9 if s.target.name == "aiohttp-h1" else 0.4) for s in scenarios
    ]
    groups = {g.target: g for g in group_results(parse_results(results))}
    assert groups["aiohttp-h1"].lower_bound == "3 of 3 repeats not service-bound (k6 used 90% of its CPUs)"
    assert groups["quart-h1"].lower_bound is None
    pairs = {(c.candidate.target, c.baseline.target) for c in compare_groups(list(groups.values()))}
    assert pairs == {("grpc", "quart-h1")}  # nothing against aiohttp's k6-bound number


def test_an_idle_service_under_a_closed_model_is_a_lower_bound_but_not_under_an_open_one() -> None:
    closed = _scenarios(("grpc",), repeats=1)[0]
    idle = verdict_of(parse_result(_result(closed, 100.0, service_cpu=0.3)))
    assert idle.lower_bound == "the service used 30% of its quota"
    assert verdict_of(parse_result(_result(closed, 100.0))).lower_bound is None
    open_model = expand(
        load_matrix(ROOT / "matrix.toml"),
        "local",
        "ci",
        Overrides(targets=("grpc",), load_models=("open",)),
    ).scenarios[0]
    assert verdict_of(parse_result(_result(open_model, 100.0, service_cpu=0.3))).lower_bound is None


def test_lower_bounds_enter_no_budget_scaling() -> None:
    overrides = Overrides(targets=("aiohttp-h1",), profiles=("quarter", "small"))
    scenarios = expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios
    results = [_result(s, 800.0, k6_cpu=0.95 if s.profile.name == "small" else 0.5) for s in scenarios]
    assert budget_pairs(group_results(parse_results(results))) == []
    results = [_result(s, 800.0) for s in scenarios]
    assert len(budget_pairs(group_results(parse_results(results)))) == 1


def test_summary_gives_every_group_an_interval_and_marks_lower_bounds() -> None:
    scenarios = _scenarios(("aiohttp-h1", "quart-h1", "grpc"), repeats=3)
    rps = {"aiohttp-h1": 900.0, "quart-h1": 300.0, "grpc": 600.0}
    results = [
        _result(
            s,
            rps[s.target.name] * (1 + 0.01 * s.repeat),
            k6_cpu=0.85 if s.target.name == "aiohttp-h1" else 0.4,
        )
        for s in scenarios
    ]
    text = "\n".join(across_repeats_markdown(parse_results(results)))
    quart = next(line for line in text.splitlines() if line.startswith("| `quart-h1."))
    # Geometric mean of 303, 306, 309 is 305.99; sd of the logs 0.00980, t(0.975, 2) x 0.00980 / sqrt(3)
    # = 0.0244, so the interval is 305.99 x e^(-+0.0244).
    assert "306.0 [298.6, 313.5] |" in quart
    aiohttp = next(line for line in text.splitlines() if line.startswith("| `aiohttp-h1."))
    assert "not service-bound (k6 used 85% of its CPUs)" in aiohttp
    ratio = next(line for line in text.splitlines() if line.startswith("| gRPC vs REST"))
    assert "| grpc | quart-h1 |" in ratio
    assert " 2.00 [" in ratio  # 600 x (1.02) / 300 x (1.02), with its interval
    assert "aiohttp-h1 |" not in text.split("Ratios", 1)[1]


def test_one_repeat_says_so_instead_of_an_interval() -> None:
    results = [_result(s, 100.0) for s in _scenarios(("grpc",), repeats=1)]
    assert "100.0 (one repeat)" in "\n".join(across_repeats_markdown(parse_results(results)))


def test_build_is_compared_with_prebuilt_per_server_and_never_across_models() -> None:
    scenarios = _scenarios(("aiohttp-h1", "grpc"), repeats=2, models=("build", "prebuilt"))
    results = [_result(s, 400.0 if s.response_model == "build" else 500.0) for s in scenarios]
    comparisons = compare_groups(group_results(parse_results(results)))
    kinds = {
        (c.kind, c.candidate.target, c.candidate.response_model, c.baseline.response_model)
        for c in comparisons
    }
    assert ("build vs prebuilt", "aiohttp-h1", "build", "prebuilt") in kinds
    assert ("build vs prebuilt", "grpc", "build", "prebuilt") in kinds
    # gRPC vs REST only within one response model: once for each, never build against prebuilt.
    assert {
        (c.kind, c.candidate.target, c.candidate.response_model, c.baseline.target, c.baseline.response_model)
        for c in comparisons
        if c.kind != "build vs prebuilt"
    } == {
        ("gRPC vs REST", "grpc", "build", "aiohttp-h1", "build"),
        ("gRPC vs REST", "grpc", "prebuilt", "aiohttp-h1", "prebuilt"),
    }
    assert {c.ratios["rps"].estimate for c in comparisons if c.kind == "build vs prebuilt"} == {0.8}


def test_this_interpreter_describes_its_build() -> None:
    build = interpreter.describe()
    assert build["executable"] == os.path.realpath(sys.executable)
    assert build["optimized"] in {"pgo+lto", "pgo", "lto", "distribution", "no"}
    libpython_mapped = "/libpython" in Path("/proc/self/maps").read_text()
    assert build["libpython"] == ("shared" if libpython_mapped else "static")


def _fake_python(path: Path, version: list[int], optimized: str, can_make_venv: bool = True) -> str:
    facts = {"version_info": version, "optimized": optimized, "can_make_venv": can_make_venv}
    path.write_text(f"#!/bin/sh\necho '{json.dumps(facts)}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_setup_prefers_an_optimized_interpreter_of_the_lab_version(tmp_path: Path) -> None:
    plain = _fake_python(tmp_path / "plain", [3, 11], "no")
    newer = _fake_python(tmp_path / "newer", [3, 12], "pgo+lto")
    no_venv = _fake_python(tmp_path / "no-venv", [3, 11], "distribution", can_make_venv=False)
    optimized = _fake_python(tmp_path / "optimized", [3, 11], "distribution")
    assert interpreter.pick([plain, newer, no_venv, optimized]) == optimized
    assert interpreter.pick([newer, plain]) == plain  # none optimized: the first of the lab version
    assert interpreter.pick([str(tmp_path / "missing"), newer]) == str(tmp_path / "missing")
