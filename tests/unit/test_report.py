"""The report: comparison pairs from target attributes, regressions and rendering (the real run:
tests/e2e/test_report_run.py)."""

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ServiceHandle, ServiceUsage
from labrunner.cli import report as cli
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report import document, payload
from labrunner.report.compare import (
    SEQUENTIAL,
    THROUGHPUT,
    against_baseline,
    budget_pairs,
    compare_groups,
    group_results,
    is_regression,
)
from labrunner.report.sections.latency import NO_LATENCY_CHART
from labrunner.results.record import build_result, judge_outcome
from labrunner.results.result import parse_results
from labrunner.results.store import RESULT_SCHEMA, result_path
from labrunner.run.k6.result import K6Run
from labrunner.run.outcome import ScenarioOutcome
from PIL import Image

from tests.support import ALL_TARGETS, ROOT, ok_result

REST_AND_GRPC = tuple(t for t in ALL_TARGETS if t != "grpc-stream")  # the unary targets


def _scenarios(targets: tuple[str, ...], profiles: tuple[str, ...], repeats: int) -> tuple[Scenario, ...]:
    overrides = Overrides(targets=targets, profiles=profiles, repeats=repeats)
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios


def _result(scenario: Scenario, rps: float, p99: float = 10.0, cpu_s: float = 1.0) -> dict[str, Any]:
    """The parts of a result the report reads, with the real scenario section."""
    requests = int(rps * 3)
    return ok_result(
        scenario,
        requests=requests,
        rps=rps,
        latency_ms={"avg": p99 / 4, "p50": p99 / 5, "p90": p99 / 2, "p95": p99 / 1.5, "p99": p99},
        received_bytes=requests * 1000,
        window_s=3.0,
        cpu_seconds=cpu_s,
        quota_used=0.9,
        error_rate=0.0,
    )


def _built(outcome: ScenarioOutcome) -> dict[str, Any]:
    """The result the session writes: the outcome with the judge's verdict."""
    return build_result(outcome, judge_outcome(outcome))


def _pairs(comparisons: list[Any]) -> set[tuple[str, str, str]]:
    return {(c.kind, c.candidate.target, c.baseline.target) for c in comparisons}


def test_pairs_come_from_target_attributes() -> None:
    results = [_result(s, 100.0 + s.repeat) for s in _scenarios(REST_AND_GRPC, ("small",), 2)]
    groups = group_results(parse_results(results))
    assert [g.target for g in groups] == list(REST_AND_GRPC)
    assert all(len(g.results) == 2 and g.kind == THROUGHPUT for g in groups)
    assert _pairs(compare_groups(groups)) == {
        ("HTTP/2 vs HTTP/1.1", "quart-h2-tls", "quart-h1-tls"),
        ("gRPC vs REST", "grpc", "aiohttp-h1"),
        ("gRPC vs REST", "grpc", "quart-h1"),
        ("gRPC vs REST", "grpc-tls", "aiohttp-h1-tls"),
        ("gRPC vs REST", "grpc-tls", "quart-h1-tls"),
        ("gRPC vs REST", "grpc-tls", "quart-h2-tls"),
        ("REST server vs REST server", "aiohttp-h1", "quart-h1"),
        ("REST server vs REST server", "aiohttp-h1-tls", "quart-h1-tls"),
    }


def test_second_implementations_pair_with_the_first_at_equal_protocol() -> None:
    targets = (
        "quart-h1-tls",
        "quart-h2-tls",
        "grpc",
        "grpc-stream",
        "granian-h1-tls",
        "granian-h2-tls",
        "grpclib",
    )
    groups = group_results(
        parse_results([_result(s, 100.0 + s.repeat) for s in _scenarios(targets, ("small",), 2)])
    )
    pairs = _pairs(compare_groups(groups))
    assert {pair for pair in pairs if "server vs" in pair[0]} == {
        ("REST server vs REST server", "quart-h1-tls", "granian-h1-tls"),
        ("REST server vs REST server", "quart-h2-tls", "granian-h2-tls"),
        ("gRPC server vs gRPC server", "grpc", "grpclib"),  # not grpc-stream: another script
    }
    assert ("HTTP/2 vs HTTP/1.1", "granian-h2-tls", "granian-h1-tls") in pairs


def test_uninstrumented_targets_answer_only_metrics_on_vs_off() -> None:
    # grpc-stream (instrumented) is no "metrics on" side for unary grpc-nometrics: a different request.
    targets = ("aiohttp-h1", "grpc", "grpc-stream", "aiohttp-h1-nometrics", "grpc-nometrics")
    groups = group_results(
        parse_results([_result(s, 100.0 + s.repeat) for s in _scenarios(targets, ("small",), 2)])
    )
    assert _pairs(compare_groups(groups)) == {
        ("metrics on vs off", "aiohttp-h1", "aiohttp-h1-nometrics"),
        ("metrics on vs off", "grpc", "grpc-nometrics"),
        ("gRPC vs REST", "grpc", "aiohttp-h1"),
        ("gRPC vs REST", "grpc-nometrics", "aiohttp-h1-nometrics"),
        ("gRPC streaming vs unary", "grpc-stream", "grpc"),
    }


def test_budget_pairs_compare_consecutive_profiles_of_one_target() -> None:
    scenarios = _scenarios(("grpc", "quart-h1"), ("small", "p1", "p2"), 2)
    results = [
        _result(s, {"small": 100.0, "p1": 400.0, "p2": 700.0}[s.profile.name] + s.repeat) for s in scenarios
    ]
    comparisons = budget_pairs(group_results(parse_results(results)))
    assert _pairs(comparisons) == {
        ("p1 vs small (4x CPUs)", "grpc", "grpc"),
        ("p2 vs p1 (2x CPUs)", "grpc", "grpc"),
        ("p1 vs small (4x CPUs)", "quart-h1", "quart-h1"),
        ("p2 vs p1 (2x CPUs)", "quart-h1", "quart-h1"),
    }
    doubling = next(c for c in comparisons if c.kind.startswith("p2") and c.candidate.target == "grpc")
    assert doubling.ratios["rps"].estimate == pytest.approx(701.5 / 401.5)
    assert doubling.ratios["rps"].significant is True


def test_comparisons_only_within_the_same_profile_count_and_load_model() -> None:
    scenarios = _scenarios(("grpc", "aiohttp-h1"), ("small", "p1"), 1)
    groups = group_results(parse_results([_result(s, 100.0) for s in scenarios]))
    comparisons = compare_groups(groups)
    assert {(c.candidate.profile, c.baseline.profile) for c in comparisons} == {
        ("small", "small"),
        ("p1", "p1"),
    }
    assert all("rps" in c.ratios for c in comparisons)  # so the next line has ratios to look at
    assert all(r.note == "n/a: one repeat" for c in comparisons for r in c.ratios.values())


def test_sequential_groups_compare_latency() -> None:
    overrides = Overrides(targets=("grpc", "aiohttp-h1"), load_models=("seq-100",), repeats=2)
    scenarios = expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios
    groups = group_results(
        parse_results([_result(s, 500.0 + s.repeat, p99=2.0 + s.repeat) for s in scenarios])
    )
    assert {(g.kind, g.iterations) for g in groups} == {(SEQUENTIAL, 100)}
    [comparison] = compare_groups(groups)
    assert set(comparison.ratios) == {"avg", "p50", "p99"}


def test_regressions_are_significant_changes_for_the_worse() -> None:
    scenarios = _scenarios(("grpc",), ("small",), 3)
    jitter = {1: 1.0, 2: 1.02, 3: 0.98}
    baseline = group_results(
        parse_results([_result(s, 1000 * jitter[s.repeat], p99=10 * jitter[s.repeat]) for s in scenarios])
    )
    slower = group_results(
        parse_results([_result(s, 500 * jitter[s.repeat], p99=30 * jitter[s.repeat]) for s in scenarios])
    )
    faster = group_results(
        parse_results([_result(s, 2000 * jitter[s.repeat], p99=5 * jitter[s.repeat]) for s in scenarios])
    )
    [worse] = against_baseline(slower, baseline).values()
    assert set(is_regression(worse)) == {"rps", "p50", "p99", "cpu_per_1k"}  # same CPU, half the requests
    [better] = against_baseline(faster, baseline).values()
    assert is_regression(better) == []
    [same] = against_baseline(baseline, baseline).values()
    assert is_regression(same) == [] and not any(r.significant for r in same.ratios.values())


def test_service_not_cpu_bound_under_a_closed_model_is_suspect() -> None:
    [scenario] = _scenarios(("grpc",), ("small",), 1)
    address = Endpoint("127.0.0.1", 1)
    handle = ServiceHandle(scenario.id, "grpc_aio", address, address, None, None, 1, "cgroup-v1", (1,), (0,))
    summary = {
        "metrics": {
            "protolab_reqs": {"values": {"count": 300, "rate": 100.0}},
            "protolab_req_failed": {"values": {"rate": 0.0, "passes": 0, "fails": 300}},
        },
        "state": {"testRunDurationMs": 3000.0},
    }
    usage = ServiceUsage(3.0, 0.3, 0.5, 30, 0, 0.0, None, None, None, 0, "")  # 0.3 s of 1.5 s: 20%
    outcome = ScenarioOutcome(
        run_id="r",
        backend="local",
        scenario=scenario,
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
        failure=None,
        handle=handle,
        verification=None,
        k6_run=K6Run(0, summary, 3.0, 0.3, 1, ""),
        usage=usage,
        timings_s={},
    )
    [reason] = _built(outcome)["suspect"]
    assert reason.startswith("service used 20% of its 0.5-CPU quota under a closed model")


def test_markdown_and_html_carry_the_same_content(tmp_path: Path) -> None:
    png = tmp_path / "charts" / "a.png"
    png.parent.mkdir()
    Image.new("RGB", (4, 4)).save(png)
    blocks: list[document.Block] = [
        document.Heading(1, "Title <run>"),
        document.Paragraph("some **bold** and `code`"),
        document.table(("a", "b|c"), [("x", "1.0")]),
        document.Bullets(("one", "two")),
        document.Image(png, "alt", "caption"),
    ]
    md = document.to_markdown(blocks, tmp_path)
    page = document.to_html(blocks, "t")
    assert "| a | b\\|c |" in md and "![alt](charts/a.png)" in md
    assert "Title &lt;run&gt;" in page and "<b>bold</b>" in page and "<code>code</code>" in page
    assert 'src="data:image/png;base64,' in page and "charts/a.png" not in page


# --- Against a baseline run: fake run directories as the runner leaves them ---------------


def _write_run(path: Path, results: Iterable[Mapping[str, Any]], manifest: bool = True) -> Path:
    """scenarios/*.json, manifest.json (unless not) and payload.json, so the report measures nothing."""
    for result in results:
        write_json_atomic(result_path(path, result["scenario_id"]), {"schema": RESULT_SCHEMA, **result})
    if manifest:
        host = {"cpu_model": "Intel(R) Xeon(R) CPU"}
        write_json_atomic(path / "manifest.json", {"run_id": path.name, "git": {"sha": "abc"}, "host": host})
    row = payload.PayloadRow(100, 20000, 4000, 15000, 3800)
    write_json_atomic(path / "payload.json", {"schema": payload.SCHEMA, "rows": [asdict(row)]})
    return path


def _baseline_report(run: Path, baseline: Path) -> tuple[str, str]:
    """The whole report.md of `report.py RUN --baseline BASELINE`, and its baseline section."""
    assert cli.main([str(run), "--baseline", str(baseline)]) == 0
    md = (run / "report.md").read_text()
    return md, md.split(f"## Against baseline run {baseline.name}", 1)[1].split("\n## ", 1)[0]


def _row(section: str, group: str) -> str:
    [row] = [line for line in section.splitlines() if line.startswith(f"| `{group}` |")]
    return row


def _with_cpu(scenario: Scenario, rps: float, cpu_ms_per_request: float) -> dict[str, Any]:
    return _result(scenario, rps, cpu_s=int(rps * 3) * cpu_ms_per_request / 1000)


def test_one_repeat_baseline_shows_ratios_and_flags_large_changes(tmp_path: Path) -> None:
    # The quiet runs A and B on one host, one repeat each: aiohttp fell by 40%.
    before = {"aiohttp-h1": (4573.0, 0.11), "quart-h1": (747.0, 0.55), "grpc": (1587.0, 0.30)}
    after = {"aiohttp-h1": (2732.0, 0.12), "quart-h1": (706.0, 0.56), "grpc": (1367.0, 0.31)}
    scenarios = _scenarios((*before, "grpc-tls"), ("small",), 1)
    baseline = _write_run(
        tmp_path / "quietA", [_with_cpu(s, *before.get(s.target.name, (900.0, 0.4))) for s in scenarios]
    )
    run = _write_run(
        tmp_path / "quietB",
        [_with_cpu(s, *after[s.target.name]) for s in scenarios if s.target.name in after],
    )
    md, section = _baseline_report(run, baseline)
    assert "no regression" not in md.lower()
    assert NO_LATENCY_CHART in md  # closed-model runs only: latency is not charted at saturation
    groups = {s.target.name: s.group for s in scenarios}
    aiohttp = _row(section, groups["aiohttp-h1"])
    assert "| 1 / 1 | 4573.0 → 2732.0 | 0.60x (-40%) |" in aiohttp
    assert "1.09x (+9%)" in aiohttp  # CPU per request
    assert aiohttp.endswith("| one repeat: cannot judge; **large change (-40% req/s), not tested** |")
    quart = _row(section, groups["quart-h1"])
    assert "0.95x (-5%)" in quart and quart.endswith("| one repeat: cannot judge |")
    assert "0.86x (-14%)" in _row(section, groups["grpc"])
    assert (
        "3 groups present in both runs: 1 large unjudged change, 2 unjudged groups with changes within "
        "±20%. With one repeat in either run no test can judge a change"
    ) in section
    assert f"Only in the baseline: `{groups['grpc-tls']}`." in section


def _repeated(targets: dict[str, float], jitter: Mapping[int, float]) -> list[dict[str, Any]]:
    return [
        _result(s, targets[s.target.name] * jitter[s.repeat]) for s in _scenarios((*targets,), ("small",), 3)
    ]


_JITTER = {1: 1.0, 2: 1.03, 3: 0.97}
_OTHER_JITTER = {1: 0.98, 2: 1.0, 3: 1.02}


def test_repeated_regression_is_significant_with_its_interval(tmp_path: Path) -> None:
    baseline = _write_run(tmp_path / "before", _repeated({"aiohttp-h1": 1000.0, "grpc": 500.0}, _JITTER))
    run = _write_run(tmp_path / "after", _repeated({"aiohttp-h1": 600.0, "grpc": 495.0}, _OTHER_JITTER))
    md, section = _baseline_report(run, baseline)
    assert "no regression" not in md.lower()
    [aiohttp, grpc] = (s.group for s in _scenarios(("aiohttp-h1", "grpc"), ("small",), 1))
    row = _row(section, aiohttp)
    match = re.search(r"\*\*0\.60x \(-40%\)\*\* \[(\d\.\d\d), (\d\.\d\d)\] significant", row)
    assert match, row
    assert float(match[1]) < 0.60 < float(match[2]) < 1
    assert "| **significant regression** (req/s, CPU s / 1k req) |" in row  # same CPU, fewer requests
    assert "cannot judge" not in section and "large change" not in row  # significant: judged, not flagged
    assert "3 / 3" in row
    assert "2 groups present in both runs: **1 significant regression**, 1 group within noise." in section
    assert _row(section, grpc).endswith("| within noise |")


def test_small_repeated_change_is_within_noise(tmp_path: Path) -> None:
    baseline = _write_run(tmp_path / "before", _repeated({"aiohttp-h1": 1000.0, "grpc": 500.0}, _JITTER))
    run = _write_run(tmp_path / "after", _repeated({"aiohttp-h1": 990.0, "grpc": 505.0}, _OTHER_JITTER))
    _, section = _baseline_report(run, baseline)
    [aiohttp, grpc] = (s.group for s in _scenarios(("aiohttp-h1", "grpc"), ("small",), 1))
    row = _row(section, aiohttp)
    assert re.search(r"\| 0\.99x \(-1%\) \[0\.9\d, 1\.\d\d\] not significant \|", row), row
    assert row.endswith("| within noise |") and _row(section, grpc).endswith("| within noise |")
    assert "No regression among 2 groups present in both runs: every group has repeats" in section


def test_baseline_from_older_code_and_failed_groups(tmp_path: Path) -> None:
    # An older run: no manifest, results without the keys later code adds, one group failed.
    scenarios = _scenarios(("aiohttp-h1", "grpc"), ("small",), 2)
    old = []
    for s in scenarios:
        result = {k: v for k, v in _result(s, 1000.0 + s.repeat).items() if k not in ("suspect", "notes")}
        if s.target.name == "grpc":
            result.update(status="failed", k6=None, service=None, failure={"phase": "start", "message": "x"})
        old.append(result)
    baseline = _write_run(tmp_path / "old", old, manifest=False)
    newer = [
        {**r, "later_key": {"anything": 1}, "scenario": {**r["scenario"], "later_key": "x"}}
        for r in (_result(s, 1000.0 + s.repeat) for s in scenarios)
    ]
    run = _write_run(tmp_path / "new", newer)
    md, section = _baseline_report(run, baseline)
    [aiohttp, grpc] = (s.group for s in _scenarios(("aiohttp-h1", "grpc"), ("small",), 1))
    assert _row(section, aiohttp).endswith("| within noise |")
    assert _row(section, grpc).endswith("| not compared: no successful repeat in the baseline |")
    assert (
        "2 groups present in both runs: 1 group within noise, 1 group without a successful repeat" in section
    )
    assert "no regression" not in md.lower()


def test_p99_9_is_reported_where_results_carry_it_and_older_ones_still_report(tmp_path: Path) -> None:
    # Results from before p(99.9) was a trend statistic have no "p99.9"; newer ones do.
    scenarios = _scenarios(("aiohttp-h1", "grpc"), ("small",), 2)
    results = [_result(s, 1000.0 + s.repeat) for s in scenarios]
    for s, result in zip(scenarios, results, strict=True):
        if s.target.name == "aiohttp-h1":
            result["k6"]["metrics"]["latency_ms"]["p99.9"] = 12.5
            result["k6"]["metrics"]["latency_count"] = 10_000  # a repeat: enough for its own p99.9
    run = _write_run(tmp_path / "run", results)
    assert cli.main([str(run)]) == 0
    latency = (run / "report.md").read_text().split("## Latency across repeats", 1)[1].split("\n## ", 1)[0]
    [aiohttp, grpc] = (s.group for s in _scenarios(("aiohttp-h1", "grpc"), ("small",), 1))
    assert f"| `{aiohttp}` | p99.9 | 2 | 12.50 |" in latency
    assert f"| `{grpc}` | p99 |" in latency and f"| `{grpc}` | p99.9 |" not in latency
