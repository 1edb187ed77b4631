"""The floor servers in the matrix (targets, preset floor) and in the report (lab against floor)."""

from pathlib import Path
from typing import Any

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.questions import FLOOR_PREFIX, is_floor
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report import floor, repeats
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.document import Table, to_markdown
from labrunner.report.sections import floor as floor_section
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict

from benchmarks.floor.common import floor_settings
from services.common.config import load_settings
from services.common.environment import ConfigError
from services.common.stacks import STACKS
from tests.support import ALL_TARGETS, FLOOR_TARGETS, LAB_TARGETS, ROOT

MATRIX = ROOT / "matrix.toml"


def test_every_stack_has_one_floor_target_copying_one_lab_target() -> None:
    targets = load_matrix(MATRIX).targets
    assert sorted(targets[name].service for name in FLOOR_TARGETS) == sorted(s.package for s in STACKS)
    assert all(name in targets and targets[name].module is None for name in LAB_TARGETS), LAB_TARGETS


def test_a_floor_target_is_its_lab_target_on_another_module() -> None:
    targets = load_matrix(MATRIX).targets
    for name in FLOOR_TARGETS:
        floor_target, lab = targets[name], targets[name.removeprefix(FLOOR_PREFIX)]
        assert floor_target.module == f"benchmarks.floor.{lab.service}"
        assert (ROOT / "benchmarks" / "floor" / f"{lab.service}.py").is_file()
        same = ("service", "script", "protocol", "tls", "expect_proto", "env", "response_model")
        assert [getattr(floor_target, a) for a in same] == [getattr(lab, a) for a in same], name
        assert lab.module is None and lab.main_module == f"services.{lab.service}"


def test_the_floor_preset_interleaves_each_lab_server_with_its_floor() -> None:
    matrix = load_matrix(MATRIX)
    plan = expand(matrix, "local", "floor")
    one_repeat = [(s.target.name, s.response_model) for s in plan.scenarios if s.repeat == 1]
    assert sorted(one_repeat) == sorted(
        (target, model) for target in (*LAB_TARGETS, *FLOOR_TARGETS) for model in ("build", "prebuilt")
    )
    assert [s.repeat for s in plan.scenarios] == sorted(s.repeat for s in plan.scenarios)  # repeats outermost
    assert {s.repeat for s in plan.scenarios} == {1, 2, 3, 4, 5}
    assert {(s.profile.name, s.count, s.load_model.executor, s.load_model.vus) for s in plan.scenarios} == {
        ("quarter", 100, "constant-vus", 10)
    }
    for preset in ("default", "ci"):
        names = {s.target.name for s in expand(matrix, "local", preset).scenarios}
        assert names.isdisjoint(FLOOR_TARGETS), preset


def _result(scenario: Scenario, rps: float, cpu_s: float, k6_cpu: float = 0.3) -> dict[str, Any]:
    """What the report reads of a result: k6's requests and the service's CPU over 10 s."""
    return {
        "scenario_id": scenario.id,
        "status": "ok",
        "scenario": scenario_dict(scenario),
        "k6": {
            "cpu_utilisation": k6_cpu,
            "metrics": {"requests": int(rps * 10), "requests_per_second": rps, "errors": 0, "latency_ms": {}},
        },
        "service": {"usage": {"cpu_seconds": cpu_s, "cpu_utilisation": 1.0}},
        "suspect": [],
    }


def _floor_run(floor_k6_cpu: float = 0.3) -> list[dict[str, Any]]:
    """aiohttp-h1, grpc and their floors, 3 repeats of each model: the lab serves 0.8x its floor's req/s
    on the same CPU, so its CPU per request is 1.25x."""
    overrides = Overrides(targets=("aiohttp-h1", "grpc", "floor-aiohttp-h1", "floor-grpc"), repeats=3)
    results = []
    for s in expand(load_matrix(MATRIX), "local", "floor", overrides).scenarios:
        rps = 1000.0 + s.repeat
        if s.target.name.startswith(FLOOR_PREFIX):
            results.append(_result(s, rps, 2.5, floor_k6_cpu))
        else:
            results.append(_result(s, 0.8 * rps, 2.5))
    return results


def test_each_lab_group_is_compared_with_its_floor_alone() -> None:
    groups = group_results(parse_results(_floor_run()))
    comparisons = floor.floor_comparisons(groups)
    assert {(c.kind, c.candidate.id, c.baseline.id) for c in comparisons} == {
        ("lab vs floor", f"{target}.quarter.c100.closed{model}", f"floor-{target}.quarter.c100.closed{model}")
        for target in ("aiohttp-h1", "grpc")
        for model in ("", ".prebuilt")
    }
    for c in comparisons:
        assert c.ratios["rps"].estimate == pytest.approx(0.8)
        assert c.ratios["cpu_per_1k"].estimate == pytest.approx(1.25, rel=1e-3)
        assert c.ratios["rps"].significant and c.ratios["cpu_per_1k"].significant

    # The questions between targets are the lab's: no floor in them (unfiltered, gRPC vs REST has some).
    def with_floors(groups: list[Any]) -> set[str]:
        sides = [g for c in compare_groups(groups) for g in (c.candidate, c.baseline)]
        return {g.target for g in sides if is_floor(g)}

    assert with_floors(groups) and not with_floors(floor.lab_groups(groups))


def test_the_report_section_and_summary_show_lab_over_floor(tmp_path: Path) -> None:
    results = _floor_run()
    markdown = to_markdown(floor_section.section(group_results(parse_results(results))), tmp_path)
    assert markdown.startswith("## Lab against floor")
    rows = [line for line in markdown.splitlines() if line.startswith("| aiohttp-h1 | prebuilt")]
    assert len(rows) == 1 and "0.80x [" in rows[0] and "1.25x [" in rows[0]
    summary = "\n".join(repeats.across_repeats_markdown(parse_results(results)))
    assert summary.count("| lab vs floor |") == 4


def test_a_floor_bounded_by_k6_is_no_floor() -> None:
    blocks = floor_section.section(group_results(parse_results(_floor_run(floor_k6_cpu=0.95))))
    assert not any(isinstance(b, Table) for b in blocks)
    text = to_markdown(blocks, Path())
    assert text.count("k6 used 95% of its CPUs") == 4
    assert floor.floor_comparisons(group_results(parse_results(_floor_run(floor_k6_cpu=0.95)))) == []


def test_runs_without_floors_have_no_floor_section() -> None:
    overrides = Overrides(targets=ALL_TARGETS[:2], repeats=2)
    scenarios = expand(load_matrix(MATRIX), "local", "ci", overrides).scenarios
    assert floor.pairs(group_results(parse_results([_result(s, 100.0, 1.0) for s in scenarios]))) == []


SETTINGS = ("HOST", "RECORD_POOL_SIZE", "RECORD_SEED", "DEFAULT_COUNT", "MAX_COUNT", "MAX_REQUEST_BYTES")


def test_a_floor_reads_the_workload_with_the_labs_parser_and_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*SETTINGS, "PORT", "WORKERS", "RESPONSE_MODEL", "TLS_CERT_FILE", "RECORD_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORKERS", "1")
    lab, floor_ = load_settings("rest_aiohttp"), floor_settings("floor_rest_aiohttp")
    assert (floor_.host, floor_.pool_size, floor_.seed, floor_.default_count, floor_.max_count) == (
        lab.host,
        lab.record_pool_size,
        lab.record_seed,
        lab.default_count,
        lab.max_count,
    )
    assert floor_.max_request_bytes == lab.max_request_bytes
    monkeypatch.setenv("MAX_COUNT", "500")
    assert floor_settings("floor_rest_aiohttp").max_count == load_settings("rest_aiohttp").max_count == 500


def test_a_floor_refuses_what_the_lab_refuses_in_its_words(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DEFAULT_COUNT", "5")
    monkeypatch.setenv("MAX_COUNT", "3")
    with pytest.raises(ConfigError) as lab:
        load_settings("rest_aiohttp")
    with pytest.raises(SystemExit) as floor_exit:
        floor_settings("floor_rest_aiohttp")
    assert floor_exit.value.code == 2
    assert capsys.readouterr().err == f"configuration error: {lab.value}\n"
