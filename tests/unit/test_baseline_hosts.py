"""--baseline across hosts: fingerprints compared first, absolute changes not judged, ratios between
targets side by side; a baseline without a fingerprint is compared as before, with a note."""

from pathlib import Path
from typing import Any

from labrunner.report import host_conditions
from labrunner.report.compare import group_results
from labrunner.report.document import Paragraph, Table
from labrunner.report.runs import Run
from labrunner.report.sections import baseline
from labrunner.report.sections import summary as summary_section
from labrunner.report.sections.section import Report
from labrunner.results.result import parse_results

EPYC = {
    "cpu_model": "AMD EPYC",
    "cpu_family_model_stepping": "25/1/1",
    "microcode": "0x1000065",
    "cores": 2,
    "threads": 2,
    "governor": None,
    "kernel": "6.18.44-fc",
    "virtualisation": {"hypervisor": True, "vendor": "KVM"},
    "mitigations": {
        "meltdown": "Not affected",
        "spectre_v2": "Mitigation: Retpolines",
        "srbds": "Vulnerable",
    },
    "cgroup": "v2",
    "interpreter": "CPython 3.11.2",
}
XEON = {**EPYC, "cpu_model": "Intel Xeon", "cpu_family_model_stepping": "6/143/8"}
TARGETS = {"grpc": ("grpc_aio", "grpc"), "quart-h1": ("rest_quart", "http1.1")}


def _result(target: str, repeat: int, rps: float) -> dict[str, Any]:
    service, protocol = TARGETS[target]
    requests = int(rps * 10)
    return {
        "scenario_id": f"{target}.quarter.c100.closed.r{repeat}",
        "status": "ok",
        "scenario": {
            "group": f"{target}.quarter.c100.closed",
            "target": target,
            "service": service,
            "protocol": protocol,
            "tls": False,
            "profile": {"name": "quarter", "cpus": 0.25, "memory_bytes": 2**29},
            "count": 100,
            "duration_s": 10.0,
            "load_model": {"name": "closed", "executor": "constant-vus"},
            "repeat": repeat,
        },
        "k6": {
            "cpu_utilisation": 0.3,
            "metrics": {"requests": requests, "requests_per_second": rps, "latency_ms": {"p99": 20.0}},
        },
        "service": {"usage": {"cpu_seconds": requests * 0.001, "cpu_utilisation": 0.98}},
        "suspect": [],
        "lower_bound": None,
    }


def _run(name: str, fingerprint: dict[str, Any] | None, scale: float, grpc_over_quart: float) -> Run:
    results = [
        _result(target, i, base * scale * (grpc_over_quart if target == "grpc" else 1.0))
        for target in TARGETS
        for i, base in enumerate((400.0, 404.0, 396.0), start=1)
    ]
    manifest = {"run_id": name, "git": {"sha": name}, "host": {"cpu_model": "AMD EPYC"}}
    if fingerprint is not None:
        manifest["fingerprint"] = fingerprint
    return Run(Path(name), name, manifest, tuple(results), tuple(group_results(parse_results(results))))


def _text(blocks: list[Any]) -> list[str]:
    return [b.text for b in blocks if isinstance(b, Paragraph)]


def test_runs_from_different_hosts_say_so_first_judge_no_absolute_change_and_show_ratios() -> None:
    now, then = _run("now", XEON, 2.0, 1.21), _run("then", EPYC, 1.0, 1.07)
    blocks = baseline.section(now, then)
    first = _text(blocks)[0]
    assert first.startswith(
        "**The runs come from different hosts**: cpu_model: AMD EPYC -> Intel Xeon; "
        "cpu_family_model_stepping: 25/1/1 -> 6/143/8."
    )
    tables = [b for b in blocks if isinstance(b, Table)]
    # req/s doubled, yet no group is a regression or an improvement: another host.
    assert [row[0] for row in tables[0].rows] == [
        "`grpc.quarter.c100.closed`",
        "`quart-h1.quarter.c100.closed`",
    ]
    assert all(row[-1] == "different host: not judged" for row in tables[0].rows)
    assert any("; different host: not judged" in t for t in _text(blocks))
    [side_by_side] = [t for t in tables if t.headers[2] == "req/s then"]
    [row] = [
        r for r in side_by_side.rows if r[1] == "`grpc.quarter.c100.closed` / `quart-h1.quarter.c100.closed`"
    ]
    assert row[2].startswith("1.07x [") and row[3].startswith("1.21x [")
    # The summary's columns against the baseline name the host instead of a regression.
    summary = summary_section.blocks(Report(now, then))
    cells = [c for b in summary if isinstance(b, Table) for r in b.rows for c in r]
    assert any(c.endswith("(different host)") for c in cells) and not any("REGRESSION" in c for c in cells)


def test_the_same_host_is_judged_as_before() -> None:
    now, then = _run("now", EPYC, 0.5, 1.07), _run("then", EPYC, 1.0, 1.07)
    blocks = baseline.section(now, then)
    assert not any("different hosts" in t for t in _text(blocks))
    rows = next(b for b in blocks if isinstance(b, Table)).rows
    assert any("significant regression" in row[-1] for row in rows)


def test_a_baseline_without_a_fingerprint_is_compared_as_before_with_a_note() -> None:
    now, then = _run("now", XEON, 0.5, 1.07), _run("then", None, 1.0, 1.07)
    text = _text(baseline.section(now, then))
    assert "The baseline has no host fingerprint (recorded before runs carried one)" in text[1]
    assert host_conditions.host_differences(now.manifest, then.manifest) is None


def test_provenance_rows_of_a_fingerprint() -> None:
    rows = dict(host_conditions.fingerprint_rows(EPYC))
    assert rows["fingerprint: CPU vulnerabilities"] == "1 not affected, 1 mitigated, 1 vulnerable: srbds"
    assert rows["fingerprint: virtualisation"] == "hypervisor KVM"
    assert rows["fingerprint: frequency governor"] == "unknown"
    assert rows["fingerprint: cores / threads"] == "2 / 2"
    assert host_conditions.fingerprint_rows(None) == []


def test_runs_measured_by_different_methods_say_so_first_and_judge_only_what_still_compares() -> None:
    now, then = _run("now", EPYC, 1.0, 1.07), _run("then", EPYC, 1.0, 1.07)
    now.manifest["methodology"] = 2  # then: written before the manifest carried one (version 1)
    for result in now.results:
        result["k6"]["metrics"]["latency_ms"]["p99"] = 40.0  # twice the baseline's, on a new clock
    blocks = baseline.section(now, then)
    first = _text(blocks)[0]
    assert first.startswith("**Measured by different methods**: this run by methodology v2, then by v1 (v2: ")
    assert "Still compared: req/s, " in first and "p99" not in first.split("Still compared:")[1]
    rows = next(b for b in blocks if isinstance(b, Table)).rows
    # The doubled p99 would be a significant regression under one method; here it is left out.
    assert rows and not any("regression" in row[-1] for row in rows)
    same = baseline.section(_run("now", EPYC, 1.0, 1.07), then)
    assert not any("different methods" in t for t in _text(same))
