"""The latency-throughput curve from synthetic results: its table per target and offered rate, its
charts (unary and streaming apart), the rungs not run in the report and in summary.md."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report import latency_curve
from labrunner.report.build import write_report
from labrunner.report.compare import group_results
from labrunner.report.document import Bullets, Table
from labrunner.report.sections import latency_curve as curve_section
from labrunner.report.summary import write_summaries
from labrunner.results.ladder import resolve
from labrunner.results.result import parse_results
from labrunner.results.store import MANIFEST_FILE, RESULT_SCHEMA, build_manifest, result_path
from PIL import Image

from tests.support import ROOT, latency_from_p50, ok_result

NOT_RUN = {
    "quart-h2-tls.quarter.c100.loaded-40pct.r1": "no successful closed-model result of this target in "
    "this run to take 75% of"
}
CAPACITY = {"aiohttp-h1": 600.0, "quart-h2-tls": 160.0, "grpc-stream": 20.0}  # closed req/s


def _plan() -> tuple[Scenario, ...]:
    overrides = Overrides(
        targets=("aiohttp-h1", "quart-h2-tls", "grpc-stream"),
        load_models=("closed", "loaded", "loaded-stream"),
    )
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "default", overrides).scenarios


def _result(scenario: Scenario, rps: float, p50: float, quota_used: float) -> dict[str, Any]:
    return ok_result(
        scenario,
        requests=int(rps * 10),
        rps=rps,
        latency_ms=latency_from_p50(p50),
        received_bytes=1000,
        window_s=10.0,
        cpu_seconds=quota_used * 2.5,
        quota_used=quota_used,
    )


def _results() -> list[dict[str, Any]]:
    """Closed at saturation, three repeats (the repeat moves the p50 by 10%); then each rung at its
    share of its target's closed req/s, served, latency rising with it, the 75% rung of quart-h2-tls
    not run."""
    closed = [
        _result(s, CAPACITY[s.target.name], 40.0 * 1.1 ** (s.repeat - 1), 0.98)
        for s in _plan()
        if s.load_model.rung is None
    ]
    rungs = [
        resolve(s, parse_results(closed))
        for s in _plan()
        if s.load_model.rung is not None and s.id not in NOT_RUN
    ]
    return closed + [
        _result(s, float(s.load_model.rate), s.load_model.rate / 50, s.load_model.rate / 800)
        for s in rungs
        if isinstance(s, Scenario) and s.load_model.rate is not None
    ]


def test_the_table_gives_each_target_at_each_offered_rate() -> None:
    rows = latency_curve.rows(group_results(parse_results(_results())))
    # target, held fixed, offered, ok, served, service CPU, p50, p99 (centres of the two repeats)
    # Each rung at its share of its target's closed req/s: the real offered rate of each.
    assert [row[:4] for row in rows] == [
        ["aiohttp-h1", "quarter, c100, build, loopback", "60", "1/1"],
        ["aiohttp-h1", "quarter, c100, build, loopback", "150", "1/1"],
        ["aiohttp-h1", "quarter, c100, build, loopback", "240", "1/1"],
        ["quart-h2-tls", "quarter, c100, build, loopback", "16", "1/1"],
        ["quart-h2-tls", "quarter, c100, build, loopback", "40", "1/1"],
        ["grpc-stream", "quarter, c100, build, loopback, streaming", "2", "1/1"],
        ["grpc-stream", "quarter, c100, build, loopback, streaming", "5", "1/1"],
        ["grpc-stream", "quarter, c100, build, loopback, streaming", "8", "1/1"],
    ]
    aiohttp_240 = rows[2]
    assert aiohttp_240[4:] == ["240.0", "30%", "4.80", "9.60"]


def test_conditions_offered_one_rate_make_no_curve() -> None:
    one_rate = [
        r
        for r in _results()
        if r["scenario"]["target"] == "aiohttp-h1"
        and r["scenario"]["load_model"]["name"] in ("closed", "loaded-25pct")
    ]
    assert latency_curve.rows(group_results(parse_results(one_rate))) == []


def test_the_section_names_the_rungs_not_run() -> None:
    blocks = curve_section.section(group_results(parse_results(_results())), {"not_run": NOT_RUN})
    tables = [b for b in blocks if isinstance(b, Table)]
    assert len(tables) == 1 and tables[0].headers[2:] == (
        "offered /s",
        "ok",
        "served /s",
        "service CPU",
        "p50",
        "p99",
    )
    bullets = [b for b in blocks if isinstance(b, Bullets)]
    assert bullets[0].items == tuple(f"`{scenario}`: {reason}" for scenario, reason in NOT_RUN.items())


def test_unary_and_streaming_curves_are_drawn_apart(tmp_path: Path) -> None:
    drawn = latency_curve.drawn(group_results(parse_results(_results())), tmp_path)
    paths = [path for path, _, _ in drawn]
    assert paths == [tmp_path / "latency_curve.png", tmp_path / "latency_curve_streaming.png"]
    for path in paths:
        assert path is not None
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width > 500
    unary_only = [r for r in _results() if r["scenario"]["target"] != "grpc-stream"]
    assert [
        path for path, _, _ in latency_curve.drawn(group_results(parse_results(unary_only)), tmp_path / "u")
    ] == [
        tmp_path / "u" / "latency_curve.png",
        None,
    ]


def test_the_report_and_summary_md_carry_the_curve_and_the_rungs_not_run(tmp_path: Path) -> None:
    scenarios = _plan()
    for result in _results():
        write_json_atomic(result_path(tmp_path, result["scenario_id"]), result | {"schema": RESULT_SCHEMA})
    manifest = build_manifest(
        run_id="run1",
        plan=expand(load_matrix(ROOT / "matrix.toml"), "local", "default"),
        backend={"name": "local", "reason": "test"},
        provenance={},
        argv=("run_matrix.py",),
        started_at=datetime.now(UTC),
        finished_at=None,
        complete=False,
        all_ok=None,
        settings={},
        not_run=NOT_RUN,
    )
    write_json_atomic(tmp_path / MANIFEST_FILE, manifest)
    write_summaries(tmp_path, "run1", [s.id for s in scenarios])
    summary = (tmp_path / "summary.md").read_text()
    assert f"{len(_results())} of {len(_results())} scenarios ok. 1 not run (see Not run)." in summary
    assert "## Not run" in summary
    ((scenario, reason),) = NOT_RUN.items()
    assert f"- `{scenario}`: {reason}" in summary
    md, _ = write_report(tmp_path)
    report = md.read_text()
    assert "## Latency under load" in report
    assert "charts/latency_curve.png" in report and "charts/latency_curve_streaming.png" in report
