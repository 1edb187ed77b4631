"""Findings from synthetic results: significant, not significant, a lower bound, a suspect group, a
missing baseline, equal-load latency, and streaming never set against unary; then where they are
shown: first in summary.md and the report, and at the end of a run."""

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from labrunner.cli import report as cli
from labrunner.cli.run_end import say_findings
from labrunner.files import write_json_atomic
from labrunner.model.questions import is_streaming
from labrunner.report import findings, payload
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.findings import finding as finding_model
from labrunner.report.findings import pairs as pair_findings
from labrunner.report.findings import run as run_findings
from labrunner.report.findings import text as findings_text
from labrunner.report.stats import Ratio, holm
from labrunner.report.summary import write_summaries
from labrunner.results.result import parse_results
from labrunner.results.store import RESULT_SCHEMA, result_path

TARGETS = {
    # name: (service, protocol, tls, script)
    "aiohttp-h1": ("rest_aiohttp", "http1.1", False, "k6/rest.js"),
    "quart-h1": ("rest_quart", "http1.1", False, "k6/rest.js"),
    "quart-h1-tls": ("rest_quart", "http1.1", True, "k6/rest.js"),
    "quart-h2-tls": ("rest_quart", "http2", True, "k6/rest.js"),
    "grpc": ("grpc_aio", "grpc", False, "k6/grpc_unary.js"),
    "grpc-stream": ("grpc_aio", "grpc", False, "k6/grpc_stream.js"),
    "floor-quart-h1": ("floor_quart", "http1.1", False, "k6/rest.js"),
}


def _result(
    target: str,
    repeat: int,
    rps: float,
    cpu_per_request_s: float = 0.001,
    model: str = "closed",
    k6_cpu: float = 0.3,
    p50: float = 5.0,
    suspect: tuple[str, ...] = (),
) -> dict[str, Any]:
    service, protocol, tls, script = TARGETS[target]
    executor = "constant-vus" if model == "closed" else "constant-arrival-rate"
    requests = int(rps * 10)
    return {
        "scenario_id": f"{target}.quarter.c100.{model}.r{repeat}",
        "status": "ok",
        "scenario": {
            "group": f"{target}.quarter.c100.{model}",
            "target": target,
            "service": service,
            "script": script,
            "protocol": protocol,
            "tls": tls,
            "env": {},
            "profile": {"name": "quarter", "cpus": 0.25, "memory_bytes": 2**29},
            "count": 100,
            "response_model": "build",
            "network": {"name": "loopback"},
            "load_model": {"name": model, "executor": executor, "rate": 50 if model == "open" else None},
            "repeat": repeat,
        },
        "k6": {
            "cpu_utilisation": k6_cpu,
            "metrics": {
                "requests": requests,
                "requests_per_second": rps,
                "latency_ms": {"p50": p50, "p99": p50 * 4},
                "data_received_bytes": requests * 1000,
            },
        },
        "service": {"usage": {"cpu_seconds": cpu_per_request_s * requests, "cpu_utilisation": 0.98}},
        "suspect": list(suspect),
    }


def _run(spec: dict[str, list[float]], **kwargs: Any) -> list[dict[str, Any]]:
    return [_result(t, i + 1, rps, **kwargs) for t, values in spec.items() for i, rps in enumerate(values)]


def _find(results: list[dict[str, Any]]) -> list[finding_model.Finding]:
    evidence = finding_model.Evidence(tuple(group_results(parse_results(results))))
    return pair_findings.findings(evidence) + run_findings.findings(evidence)


def _one(found: list[finding_model.Finding], question: str, text: str) -> finding_model.Finding:
    [finding] = [f for f in found if f.question == question and text in f.sentence]
    return finding


def test_a_significant_difference_names_its_ratio_interval_and_what_was_held_fixed() -> None:
    results = _run({"grpc": [600, 610, 590]}, cpu_per_request_s=0.0008) + _run({"quart-h1": [400, 405, 395]})
    finding = _one(_find(results), "gRPC vs REST", "grpc vs")
    assert finding.sentence.startswith("grpc vs quart-h1: req/s 1.50x [")
    assert finding.sentence.endswith("], CPU/req 0.80x")  # no latency measured: no p50 or p99
    assert "?" not in finding.sentence and "≈" not in finding.sentence
    assert finding.held_fixed == "quarter profile (0.25 CPU), 100 records, build, closed model, no TLS"
    assert finding.effect > 0.4


def test_an_interval_that_holds_one_is_inconclusive_and_ranks_last() -> None:
    found = _find(
        _run({"grpc": [500, 620, 420], "quart-h1": [480, 560, 450], "aiohttp-h1": [1500, 1510, 1490]})
    )
    close = _one(found, "gRPC vs REST", "vs quart-h1")
    assert "req/s 1.0" in close.sentence and "] ?, CPU/req" in close.sentence
    assert close.effect == 0.0
    ranked = [f for f in findings.ranked(found) if f.question == "gRPC vs REST"]
    assert ranked[-1] is close


def test_only_an_equivalence_test_says_equivalent_else_inconclusive() -> None:
    # Two repeats of a tail percentile on the README's run: 1.40x [0.03, 66.96] tells nothing, so it
    # is no finding (wider than 3x) and says what would sharpen it (test_audit_fixes has the count).
    glance = finding_model.glance
    wide = Ratio(1.40, 0.03, 66.96, 0.9, False, rounds=2)
    assert glance(wide, "p99", "a vs b") == (
        "p99 —",
        [
            finding_model.Note(
                "a vs b: too few rounds: about 302 needed for ±5%", "p99 —", finding_model.VERDICT
            )
        ],
    )
    unsure = Ratio(1.40, 0.90, 2.10, 0.4, False, rounds=3)  # within 3x: inconclusive, its interval noted
    assert glance(unsure, "p99", "a vs b") == (
        "p99 ?",
        [finding_model.Note("a vs b 1.40x [0.90, 2.10]", "p99 ? (inconclusive)", finding_model.VERDICT)],
    )
    narrow = Ratio(1.18, 0.93, 1.50, 0.2, False, equivalent=False)  # req/s shows its interval itself
    assert glance(narrow, "req/s", "a vs b") == ("req/s 1.18x [0.93, 1.50] ?", [])
    same = Ratio(1.01, 0.97, 1.05, 0.6, False, equivalent=True)
    assert glance(same, "req/s", "a vs b") == ("req/s 1.01x [0.97, 1.05] ≈", [])
    assert glance(same, "p50", "a vs b") == ("p50 ≈", [])
    clear = Ratio(13.3, 5.0, 14.9, 0.01, True)  # excluding 1 and under 3x wide: a difference
    assert glance(clear, "p50", "a vs b") == ("p50 13.30x [5.00, 14.90]", [])
    vague = Ratio(13.3, 1.2, 150.0, 0.01, True, rounds=3)  # excluding 1 but 125x wide: no finding
    assert glance(vague, "p50", "a vs b")[0] == "p50 —"
    assert (
        glance(vague, "p50", "a vs b")[1][0].alone
        == "p50 —: a vs b: too few rounds: about 1,538 needed for ±5%"
    )
    away = Ratio(1.08, 1.01, 1.15, 0.03, False, finding_model.CORRECTED_AWAY)
    [why] = glance(away, "req/s", "a vs b")[1]
    assert glance(away, "req/s", "a vs b")[0] == "req/s 1.08x [1.01, 1.15] ?"
    assert why.alone == "req/s ? (significant alone, not after Holm's correction): a vs b"


def test_tight_repeats_within_ten_percent_are_equivalent_by_tost() -> None:
    found = _find(_run({"grpc": [500, 506, 494, 503], "quart-h1": [501, 497, 505, 499]}))
    assert "] ≈, CPU/req" in _one(found, "gRPC vs REST", "vs quart-h1").sentence


def test_a_difference_significant_alone_is_inconclusive_after_holms_correction() -> None:
    # grpc vs quart-h1 alone: p = 0.033 (< 0.05, paired by round). With aiohttp-h1 measured like
    # grpc, the run holds two such req/s tests (aiohttp-h1 vs quart-h1 too) and one of p = 1: Holm
    # multiplies the two smallest by 3 and 2 (0.10), so neither passes any more.
    alone = {"grpc": [600, 640, 620], "quart-h1": [560, 569, 578]}
    [finding] = [f for f in _find(_run(alone)) if f.question == "gRPC vs REST"]
    assert "?" not in finding.sentence and finding.effect > 0
    found = _find(_run({**alone, "aiohttp-h1": [600, 640, 620]}))
    grpc = _one(found, "gRPC vs REST", "grpc vs quart-h1")
    assert "req/s 1.09x [" in grpc.sentence and "] ?, CPU/req" in grpc.sentence and grpc.effect == 0.0
    assert "req/s ? (significant alone, not after Holm's correction): grpc vs quart-h1" in grpc.caveats
    servers = _one(found, "server vs server", "quart-h1 vs aiohttp-h1")
    assert "req/s 0.92x [" in servers.sentence and "] ?, CPU/req" in servers.sentence


def test_a_round_that_slowed_every_target_cancels_in_the_paired_ratio() -> None:
    # Round 3 ran 30% slower for both (the host, as in a default run on 2026-12-02): each round's
    # ratio is 3.0, so the ratio is exact, where two independent groups would spread ±25%.
    found = _find(_run({"aiohttp-h1": [1500, 1410, 1000], "quart-h1": [500, 470, 333.3333333333]}))
    finding = _one(found, "server vs server", "aiohttp-h1 vs quart-h1")
    assert finding.sentence.startswith("aiohttp-h1 vs quart-h1: req/s 3.00x [3.00, 3.00]")


def test_holm_adjusts_as_hand_computed() -> None:
    # Sorted 0.005, 0.01, 0.03, 0.04: times 4, 3, 2, 1, then made non-decreasing.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []


def test_a_response_model_finding_names_each_side_by_its_model() -> None:
    prebuilt = _run({"aiohttp-h1": [1000, 1010, 990]})
    for result in prebuilt:
        result["scenario"]["response_model"] = "prebuilt"
        result["scenario"]["group"] += ".prebuilt"
        result["scenario_id"] += ".prebuilt"
    [finding] = [
        f for f in _find(_run({"aiohttp-h1": [800, 810, 790]}) + prebuilt) if f.question == "response model"
    ]
    assert finding.sentence.startswith("aiohttp-h1 (build) vs aiohttp-h1 (prebuilt): req/s 0.80x [")


def test_a_lower_bound_enters_no_ratio_and_is_named() -> None:
    results = _run({"grpc": [600, 610, 590]}) + _run({"aiohttp-h1": [900, 910, 905]}, k6_cpu=0.93)
    found = _find(results)
    assert not [f for f in found if "aiohttp-h1" in f.sentence and f.question == "gRPC vs REST"]
    bound = _one(found, "run", "aiohttp-h1")
    assert "lower bound" in bound.sentence and "k6 used 93%" in bound.sentence


def test_every_group_a_lower_bound_says_the_run_cannot_compare_and_what_would() -> None:
    groups = group_results(parse_results(_run({"grpc": [600, 610], "aiohttp-h1": [900, 910]}, k6_cpu=0.95)))
    [finding] = run_findings.cannot_compare(groups)
    assert "No comparison between targets" in finding.sentence and "--load-engine" in finding.sentence


def test_a_suspect_group_is_named_in_the_finding() -> None:
    results = _run({"grpc": [600, 610, 590]}) + _run(
        {"quart-h1": [400, 405, 395]}, suspect=("other processes used 7.0% of the service's CPUs",)
    )
    finding = _one(_find(results), "gRPC vs REST", "vs quart-h1")
    assert finding.caveats == ["quart-h1, closed model: 3 of 3 repeats suspect, see summary.md"]


def test_streaming_is_compared_with_unary_grpc_never_with_rest() -> None:
    results = _run({"grpc-stream": [60, 62, 61], "grpc": [600, 610, 590], "quart-h1": [400, 405, 395]})
    comparisons = compare_groups(group_results(parse_results(results)))
    assert comparisons
    for c in comparisons:
        if is_streaming(c.candidate) or is_streaming(c.baseline):
            assert c.kind == "gRPC streaming vs unary"
            assert c.candidate.protocol == c.baseline.protocol == "grpc"
    stream = _one(_find(results), "gRPC streaming vs unary", "grpc-stream vs grpc:")
    assert ", CPU/req " in stream.sentence


def test_a_missing_baseline_is_said_and_the_preset_that_asks_is_named() -> None:
    found = _find(_run({"grpc-stream": [60, 62, 61], "quart-h1": [400, 405, 395]}))
    _one(found, "gRPC streaming vs unary", "without unary gRPC")
    [unasked] = findings.unasked(found, "default")
    assert unasked.sentence.startswith("Not asked: --preset implementations, ")
    assert unasked.sentence.endswith(", network, payload.")  # a preset named as its question: once


def test_latency_comes_from_the_highest_offered_rate_both_carried_with_their_utilisation() -> None:
    closed = _run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]})
    loaded = []
    for rate, p50 in ((50, 2.0), (200, 3.0)):
        for target, slower in (("grpc", 1.0), ("quart-h1", 2.0)):
            for i in (1, 2, 3):
                result = _result(target, i, rate, model=f"loaded-{rate}", p50=p50 * slower + i / 10)
                result["scenario"]["load_model"].update(executor="constant-arrival-rate", rate=rate)
                loaded.append(result)
    finding = _one(_find(closed + loaded), "gRPC vs REST", "vs quart-h1")
    assert ", p50 0.5" in finding.sentence and finding.load == "200 req/s"
    # Where each side ran, and how much of its quota it used there, is the finding's note.
    assert "grpc at 200 req/s: CPU 98%" in finding.caveats
    # Without open-model runs latency is not compared, and the findings say so.
    _one(_find(closed), "run", "Latency is not compared")


def test_latency_comes_from_the_highest_load_both_carried_before_a_higher_one_not_carried() -> None:
    closed = _run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]})
    loaded = []
    for rate in (50, 200):
        for target in ("grpc", "quart-h1"):
            served = 120 if (rate, target) == (200, "quart-h1") else rate  # quart-h1 does not carry 200
            for i in (1, 2, 3):
                result = _result(target, i, served, model=f"loaded-{rate}", p50=2.0 + i / 10)
                result["scenario"]["load_model"].update(executor="constant-arrival-rate", rate=rate)
                loaded.append(result)
    finding = _one(_find(closed + loaded), "gRPC vs REST", "vs quart-h1")
    assert finding.load == "50 req/s" and not [c for c in finding.caveats if "did not carry" in c]


def test_an_open_model_target_that_did_not_carry_the_rate_is_named() -> None:
    closed = _run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]})
    equal_load = [_result("grpc", i, 50, model="open") for i in (1, 2, 3)] + [
        _result("quart-h1", i, 30, model="open") for i in (1, 2, 3)
    ]
    finding = _one(_find(closed + equal_load), "gRPC vs REST", "vs quart-h1")
    assert "quart-h1 at 50 req/s: did not carry it (served 30): its latency is a queue's" in finding.caveats


def test_findings_print_grouped_by_question() -> None:
    found = _find(
        _run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395], "quart-h2-tls": [300, 290, 310]})
        + _run({"quart-h1-tls": [400, 405, 395]})
    )
    lines = findings_text.markdown(found)
    # What every question's findings hold fixed is said once, at the top; what else each holds, with it.
    held = "quarter profile (0.25 CPU), 100 records, build, closed model"
    assert lines[:3] == [f"All held fixed: {held}.", "", "- **HTTP/2 vs HTTP/1.1**, TLS"]
    assert lines[4] == "- **gRPC vs REST**, no TLS"
    questions = lines[2 : lines.index("Notes:") - 1] if "Notes:" in lines else lines[2:]
    assert all(line.startswith(("- ", "  - ")) for line in questions)
    assert findings_text.plain(found)[0] == f"findings: {held}"
    assert findings_text.plain(found)[2] == "  HTTP/2 vs HTTP/1.1, TLS"


def test_the_terminal_shows_each_questions_strongest_findings_and_points_to_the_rest() -> None:
    found = [finding_model.Finding("server vs server", f"pair {i}", effect=i / 10) for i in range(5)]
    lines = findings_text.plain(found)[2:]  # after what all held fixed and the method
    assert lines == [
        "  server vs server",
        "    pair 4",
        "    pair 3",
        "    pair 2",
        "    ... and 2 more in summary.md",
    ]
    assert len(findings_text.markdown(found)) == 6  # summary.md: all of them


def test_floor_targets_enter_no_finding() -> None:
    groups = group_results(parse_results(_run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]})))
    with_floor = group_results(
        parse_results(
            _run({"grpc": [600, 610, 590], "quart-h1": [400, 405, 395], "floor-quart-h1": [800, 805, 795]})
        )
    )
    assert findings.for_run(with_floor, "default") == findings.for_run(groups, "default")


# --- Where the findings are shown: a run directory as the runner leaves it ------------------

_RESULTS = {"grpc": [600, 610, 590], "quart-h1": [400, 405, 395]}
_HELD = "quarter profile (0.25 CPU), 100 records, build, closed model, no TLS"


def _run_dir(path: Path) -> tuple[Path, list[str]]:
    results = _run(_RESULTS)
    for result in results:
        write_json_atomic(result_path(path, result["scenario_id"]), {"schema": RESULT_SCHEMA, **result})
    order = [r["scenario_id"] for r in results]
    manifest = {
        "run_id": path.name,
        "started_at": "2031-01-02T03:04:05+00:00",
        "host": {"cpu_model": "Intel(R) Xeon(R) CPU", "cpus_available": 2, "cpu_count": 2},
        "matrix": {"preset": "default", "scenarios": [{"id": i} for i in order]},
    }
    write_json_atomic(path / "manifest.json", manifest)
    row = payload.PayloadRow(100, 20000, 4000, 15000, 3800)
    write_json_atomic(path / "payload.json", {"schema": payload.SCHEMA, "rows": [asdict(row)]})
    return path, order


def test_summary_md_opens_with_the_findings(tmp_path: Path) -> None:
    run, order = _run_dir(tmp_path / "run1")
    write_summaries(run, "run1", order)
    lines = (run / "summary.md").read_text().splitlines()
    assert lines[:7] == [
        "# protolab run run1",
        "",
        "## Findings",
        "",
        f"All held fixed: {_HELD}.",
        "",
        "- **gRPC vs REST**",
    ]
    assert (
        f"{findings_text.CONFIDENCE_LINE} {findings_text.LEGEND}" in lines
    )  # the method, after the findings
    [question] = [line for line in lines if line.startswith("- **gRPC vs REST**")]
    assert "## Scenarios" in lines
    assert lines.index(question) < lines.index("## Scenarios") < lines.index("## Across repeats")
    [sentence] = [line for line in lines if line.startswith("  - grpc vs quart-h1")]
    assert ": req/s " in sentence


def test_report_opens_with_the_findings_and_ends_with_provenance(tmp_path: Path) -> None:
    run, _ = _run_dir(tmp_path / "run1")
    assert cli.main([str(run)]) == 0  # scripts/report.py: summary.md too
    assert (run / "summary.md").read_text().startswith("# protolab run run1\n\n## Findings\n")
    md = (run / "report.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Findings" and sections[-1] == "## Provenance"
    first = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert findings_text.CONFIDENCE_LINE in first
    assert "Intel(R) Xeon(R) CPU" in first and "2031-01-02T03:04:05+00:00" in first
    assert "**gRPC vs REST**" in first and "grpc vs quart-h1" in first
    page = (run / "report.html").read_text()
    assert page.index("Findings") < page.index("grpc vs quart-h1") < page.index("Provenance")


def test_the_end_of_a_run_prints_the_findings(tmp_path: Path) -> None:
    run, order = _run_dir(tmp_path / "run1")
    said: list[str] = []
    say_findings(run, order, "default", said.append)
    lines = said
    assert lines == findings_text.plain(
        findings.for_run(group_results(parse_results(_run(_RESULTS))), "default")
    )
    assert lines[:3] == [f"findings: {_HELD}", f"  {findings_text.SHORT_METHOD}", "  gRPC vs REST"]
    assert lines[3].startswith("    grpc vs quart-h1: req/s 1.50x [")


def test_a_wide_ratio_says_how_many_repeats_would_bring_it_to_five_percent() -> None:
    results = _run({"grpc": [606, 497, 526]}) + _run({"quart-h1": [400, 405, 395]})
    finding = _one(_find(results), "gRPC vs REST", "vs quart-h1")
    # 1.35x [1.04, 1.76]: its wider side reaches 1.302x the estimate, t(2) 4.303 x sd / √3, so the
    # rounds' sd of log ratios is 0.1062; t(20) 2.086 x 0.1062 / √21 = 0.0484 is within ln 1.05 =
    # 0.0488, and t(19) 2.093 x 0.1062 / √20 = 0.0497 is not: 21 rounds (the t of 3 rounds kept: 88).
    assert finding.caveats == ["grpc vs quart-h1: req/s ±30%: about 21 rounds for ±5% (--precision)"]
    tight = _one(_find(_run({"grpc": [600, 601, 599], "quart-h1": [400, 401, 399]})), "gRPC vs REST", "vs")
    assert tight.caveats == []
