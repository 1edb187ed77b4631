"""Unit tests: k6's CPU per request (its process's CPU seconds over successful requests) for each group
in the report's summary table and for each scenario in summary.md, where both are known."""

from pathlib import Path
from typing import Any

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report.compare import group_results
from labrunner.report.document import Table
from labrunner.report.runs import Run
from labrunner.report.sections import summary as summary_section
from labrunner.report.sections.section import Report
from labrunner.report.summary import summary_markdown, summary_row
from labrunner.results.result import parse_result, parse_results

from tests.support import ROOT, latency_from_p50, ok_result

WINDOW_S = 10.0
# (req/s, k6 CPU seconds of each repeat): gRPC's k6 pays 0.060 ms a request, HTTP's 0.025 ms.
RUNS = {"grpc": (1000.0, (0.6, 0.6, 0.6)), "aiohttp-h1": (2000.0, (0.5, 0.5, 0.5))}


def _scenarios() -> tuple[Scenario, ...]:
    overrides = Overrides(targets=tuple(RUNS), repeats=3, directions=("download",))
    return tuple(s for s in expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios)


def _result(scenario: Scenario, k6_cpu_seconds: float | None) -> dict[str, Any]:
    rps, _ = RUNS[scenario.target.name]
    result = ok_result(
        scenario,
        requests=int(rps * WINDOW_S),
        rps=rps,
        latency_ms=latency_from_p50(5.0),
        received_bytes=1000,
        window_s=WINDOW_S,
        cpu_seconds=2.0,
        quota_used=0.8,
    )
    if k6_cpu_seconds is not None:
        result["k6"]["cpu_seconds"] = k6_cpu_seconds
    return result


def _results(with_k6_cpu: bool = True) -> list[dict[str, Any]]:
    return [
        _result(s, RUNS[s.target.name][1][s.repeat - 1] if with_k6_cpu else None)
        for s in _scenarios()
        if s.target.name in RUNS
    ]


def _summary_table(results: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    run = Run(Path("run"), "run", {}, tuple(results), tuple(group_results(parse_results(results))))
    (table,) = [b for b in summary_section.blocks(Report(run)) if isinstance(b, Table)]
    return {row[0].strip("`"): dict(zip(table.headers, row, strict=True)) for row in table.rows}


def test_the_report_summary_gives_k6s_cpu_per_request_for_each_group() -> None:
    results = _results()
    groups = {g.target: g for g in group_results(parse_results(results))}
    assert set(groups) == set(RUNS)
    grpc, rest = groups["grpc"].summary("k6_cpu_per_1k"), groups["aiohttp-h1"].summary("k6_cpu_per_1k")
    assert grpc is not None and rest is not None
    assert grpc.centre == pytest.approx(0.6 * 1000 / 10_000)  # ms per request
    assert rest.centre == pytest.approx(0.5 * 1000 / 20_000)
    rows = _summary_table(results)
    cells = {groups[t].id: "0.060" if t == "grpc" else "0.025" for t in RUNS}
    assert {group: row["k6 CPU / req (ms)"] for group, row in rows.items()} == cells


def test_without_k6_cpu_seconds_the_figure_is_a_dash() -> None:
    rows = _summary_table(_results(with_k6_cpu=False))
    assert rows and all(row["k6 CPU / req (ms)"] == "-" for row in rows.values())


def test_summary_md_gives_k6s_cpu_per_request_for_each_scenario() -> None:
    results = _results()
    rows = [summary_row(r) for r in parse_results(results)]
    text = summary_markdown("run", rows)
    header = next(line for line in text.splitlines() if line.startswith("| scenario |"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    column = names.index("k6 ms/req")
    assert names[column - 1] == "k6 CPU"
    for result in results:
        line = next(line for line in text.splitlines() if line.startswith(f"| {result['scenario_id']} |"))
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(names)
        expected = "0.060" if result["scenario"]["target"] == "grpc" else "0.025"
        assert cells[column] == expected, line
    no_cpu = summary_row(parse_result(_result(_scenarios()[0], None)))
    assert no_cpu["k6_cpu_per_request_ms"] is None
