"""Unit tests: result JSON from constructed outcomes, summaries, atomic writes, resume selection."""

import csv
import io
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ScenarioFailed, ServiceHandle, ServiceUsage
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import CapacitySearch, Overrides, Scenario
from labrunner.observe import interference, prometheus_sd
from labrunner.report.summary import summary_row, write_summaries
from labrunner.results.record import build_result, judge_outcome
from labrunner.results.result import parse_result
from labrunner.results.store import load_results, result_path, resumable
from labrunner.results.trust import verdict_of
from labrunner.run import capacity
from labrunner.run.k6.output import parse_summary
from labrunner.run.k6.result import K6Run
from labrunner.run.outcome import ScenarioOutcome

from tests.support import ROOT


def _scenarios() -> tuple[Scenario, ...]:
    overrides = Overrides(targets=("quart-h2-tls", "grpc"))
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios


def _summary(requests: int = 3000, failed: int = 0, dropped: int | None = None) -> dict[str, Any]:
    """The shape k6's handleSummary data has (metrics.<name>.values)."""
    metrics: dict[str, Any] = {
        "protolab_reqs": {"type": "counter", "values": {"count": requests, "rate": requests / 3.0}},
        "protolab_req_failed": {
            "type": "rate",
            "values": {"rate": failed / (requests + failed), "passes": failed, "fails": requests},
            "thresholds": {"rate<0.01": {"ok": failed / (requests + failed) < 0.01}},
        },
        "protolab_req_duration": {
            "type": "trend",
            "values": {
                **{"avg": 2.5, "p(50)": 2.0, "p(90)": 4.0, "p(95)": 5.0, "p(99)": 9.0, "p(99.9)": 15.0},
                "max": 20.0,
            },
        },
        "data_received": {"type": "counter", "values": {"count": requests * 20_000, "rate": 2e7}},
        "iterations": {"type": "counter", "values": {"count": requests + failed, "rate": 1000.0}},
        "checks": {"type": "rate", "values": {"rate": 1.0, "passes": 60, "fails": 0}},
        "vus_max": {"type": "gauge", "values": {"value": 10, "min": 10, "max": 10}},
    }
    if dropped is not None:
        metrics["dropped_iterations"] = {"type": "counter", "values": {"count": dropped, "rate": 1.0}}
    return {"metrics": metrics, "state": {"testRunDurationMs": 3000.0}}


def _handle(scenario: Scenario) -> ServiceHandle:
    address = Endpoint("127.0.0.1", 40000)
    return ServiceHandle(
        scenario_id=scenario.id,
        service=scenario.target.service,
        address=address,
        k6_address=address,
        metrics_address=Endpoint("127.0.0.1", 40001),
        prometheus_target="127.0.0.1:40001",
        workers=1,
        limits="cgroup-v1",
        service_cpus=(1,),
        k6_cpus=(0,),
        notes=("a caveat",),
    )


def _usage() -> ServiceUsage:
    return ServiceUsage(
        window_seconds=3.5,
        cpu_seconds=1.47,
        cpu_limit_cores=0.5,
        cpu_periods=35,
        throttled_periods=30,
        throttled_seconds=2.0,
        memory_peak_bytes=100 * 2**20,
        memory_peak_scope="window",
        memory_limit_bytes=512 * 2**20,
        exit_code=0,
        log_tail="bye",
        user_cpu_seconds=1.05,
        system_cpu_seconds=0.42,
    )


def _outcome(
    scenario: Scenario,
    failure: ScenarioFailed | None = None,
    summary: dict[str, Any] | None = None,
    k6_cpu: float = 0.9,
    started: int = 0,
) -> ScenarioOutcome:
    # k6's 3.0 s test run (the summary's testRunDurationMs) inside 3.5 s of process wall time.
    k6_run = K6Run(
        0, summary or _summary(), wall_seconds=3.5, cpu_seconds=k6_cpu * 3.0, cpus=1, output_tail=""
    )
    return ScenarioOutcome(
        run_id="run1",
        backend="local",
        scenario=scenario,
        started_at=datetime(2026, 1, 1, 12, 0, started, tzinfo=UTC),
        finished_at=datetime(2026, 1, 1, 12, 0, started + 5, tzinfo=UTC),
        failure=failure,
        handle=_handle(scenario),
        verification=None,
        k6_run=None if failure else k6_run,
        usage=_usage(),
        timings_s={"start": 1.0, "health": 0.2},
    )


def _built(outcome: ScenarioOutcome) -> dict[str, Any]:
    """The result the session writes: the outcome with the judge's verdict."""
    return build_result(outcome, judge_outcome(outcome))


def test_parse_summary_reads_the_uniform_metrics() -> None:
    metrics = parse_summary(_summary(requests=990, failed=10, dropped=4))
    assert (metrics.requests, metrics.errors, metrics.attempts) == (990, 10, 1000)
    assert metrics.error_rate == pytest.approx(0.01)
    assert metrics.requests_per_second == pytest.approx(330.0)
    assert metrics.latency_ms == {
        **{"avg": 2.5, "p50": 2.0, "p90": 4.0, "p95": 5.0, "p99": 9.0, "p99.9": 15.0},
        "max": 20.0,
    }
    assert (metrics.dropped_iterations, metrics.vus_max, metrics.test_run_seconds) == (4, 10, 3.0)
    assert metrics.failed_thresholds == ("protolab_req_failed rate<0.01",)
    assert parse_summary(_summary()).dropped_iterations == 0  # absent metric: nothing dropped


def test_k6_cpu_utilisation_is_over_its_test_run_not_its_start_up() -> None:
    # Under docker the wall time holds the container's creation: 25% more here.
    run = K6Run(0, _summary(), wall_seconds=4.0, cpu_seconds=2.7, cpus=1, output_tail="")
    assert run.cpu_utilisation == pytest.approx(0.9)
    without_summary = K6Run(0, None, wall_seconds=4.0, cpu_seconds=2.7, cpus=1, output_tail="")
    assert without_summary.cpu_utilisation == pytest.approx(2.7 / 4.0)


def test_result_of_a_successful_scenario() -> None:
    scenario = _scenarios()[0]
    result = _built(_outcome(scenario))
    assert result["schema"] == "protolab.result/1"
    assert (result["scenario_id"], result["status"], result["failure"]) == (scenario.id, "ok", None)
    assert result["scenario"]["profile"] == {"name": "small", "cpus": 0.5, "memory_bytes": 512 * 2**20}
    assert result["scenario"]["group"] == scenario.group
    assert result["k6"]["metrics"]["requests"] == 3000
    assert result["k6"]["cpu_utilisation"] == pytest.approx(0.9)
    assert "protolab_reqs" in result["k6"]["summary_metrics"]
    usage = result["service"]["usage"]
    # 1.47 CPU seconds over 3.0 s of load at a 0.5-core quota.
    assert usage["cpu_utilisation"] == pytest.approx(0.98)
    assert (usage["throttled_periods"], usage["memory_peak_scope"]) == (30, "window")
    assert result["service"]["cpus_shared_with_k6"] is False
    assert result["notes"] == ["a caveat"]
    assert result["suspect"] == ["k6 used 90% of its CPUs (load generator saturated)"]
    json.dumps(result)  # plain data only


def test_result_of_a_failed_scenario() -> None:
    scenario = _scenarios()[1]
    failure = ScenarioFailed("verify", "negotiated HTTP/1.1, target expects HTTP/2.0", "log")
    result = _built(_outcome(scenario, failure=failure))
    assert result["status"] == "failed"
    assert result["failure"] == {
        "phase": "verify",
        "message": "negotiated HTTP/1.1, target expects HTTP/2.0",
        "log_tail": "log",
    }
    assert result["k6"] is None
    row = summary_row(parse_result(result))
    assert row["failure"] == "verify: negotiated HTTP/1.1, target expects HTTP/2.0"
    assert row["requests"] is None


def test_suspect_flags_errors_and_dropped_iterations() -> None:
    outcome = _outcome(_scenarios()[0], summary=_summary(requests=900, failed=100, dropped=7), k6_cpu=0.2)
    assert _built(outcome)["suspect"] == ["7 iterations dropped", "error rate 10.00%"]


def test_write_json_atomic_replaces_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "a" / "r.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})  # fails while serialising
    assert json.loads(path.read_text()) == {"v": 2}  # the old file survives
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp files left
    assert path.stat().st_mode & 0o777 == 0o644


def _write_results(out: Path) -> list[Scenario]:
    scenarios = list(_scenarios())
    ok = _built(_outcome(scenarios[0], started=10))
    failed = _built(_outcome(scenarios[1], failure=ScenarioFailed("health", "timeout"), started=0))
    write_json_atomic(result_path(out, scenarios[0].id), ok)
    write_json_atomic(result_path(out, scenarios[1].id), failed)
    return scenarios


def test_resume_skips_only_ok_results(tmp_path: Path) -> None:
    scenarios = _write_results(tmp_path)
    (tmp_path / "scenarios" / "broken.json").write_text("{not json")
    write_json_atomic(tmp_path / "scenarios" / "other.json", {"schema": "something else"})
    found = resumable(tmp_path, scenarios)
    assert found.done == {scenarios[0].id}
    assert found.ignored == {
        "broken.json": "unreadable (JSONDecodeError)",
        "other.json": "not a lab result (its schema is not protolab.result/1)",
    }
    assert resumable(tmp_path / "missing", scenarios).done == set()


def test_results_order_follows_the_plan_then_start_time(tmp_path: Path) -> None:
    scenarios = _write_results(tmp_path)
    by_start = [r.scenario_id for r in load_results(tmp_path)]
    assert by_start == [scenarios[1].id, scenarios[0].id]
    by_plan = [r.scenario_id for r in load_results(tmp_path, [s.id for s in scenarios])]
    assert by_plan == [scenarios[0].id, scenarios[1].id]


def test_summaries_are_regenerated_from_result_files(tmp_path: Path) -> None:
    scenarios = _write_results(tmp_path)
    write_summaries(tmp_path, "run1", [s.id for s in scenarios])
    rows = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    # Written out, not read from the code: a column dropped from summary.csv fails here.
    assert list(rows[0]) == [
        "scenario",
        "status",
        "target",
        "service",
        "protocol",
        "tls",
        "profile",
        "cpus",
        "memory_mib",
        "count",
        "response_model",
        "direction",
        "load_model",
        "repeat",
        "network",
        "network_rtt_ms",
        "requests",
        "requests_per_s",
        "errors",
        "error_rate",
        "latency_avg_ms",
        "latency_p50_ms",
        "latency_p90_ms",
        "latency_p95_ms",
        "latency_p99_ms",
        "latency_max_ms",
        "received_bytes",
        "received_bytes_per_request",
        "dropped_iterations",
        "service_cpu_s",
        "service_cpu_utilisation",
        "service_user_cpu_share",
        "throttled_periods",
        "throttled_s",
        "memory_peak_mib",
        "k6_cpu_utilisation",
        "k6_cpu_per_request_ms",
        "others_service_cpus_share",
        "others_k6_cpus_share",
        "relay_k6_cpus_share",
        "steal_share",
        "service_cpu_per_request_cal",
        "service_cpu_per_request_kcal",
        "protocol_verified",
        "overhead_s",
        "suspect",
        "failure",
    ]
    assert (rows[0]["response_model"], rows[0]["network"], rows[0]["network_rtt_ms"]) == (
        "build",
        "loopback",
        "",
    )
    assert [(r["scenario"], r["status"]) for r in rows] == [
        (scenarios[0].id, "ok"),
        (scenarios[1].id, "failed"),
    ]
    ok = rows[0]
    assert (ok["requests"], ok["requests_per_s"], ok["latency_p99_ms"]) == ("3000", "1000.0", "9.0")
    assert float(ok["received_bytes_per_request"]) == 20_000
    assert float(ok["service_cpu_utilisation"]) == pytest.approx(0.98)
    assert rows[1]["failure"] == "health: timeout"
    markdown = (tmp_path / "summary.md").read_text()
    assert markdown.startswith("# protolab run run1")
    assert "1 of 2 scenarios ok" in markdown
    assert f"| {scenarios[0].id} | build | ok | 1000.0 | 0 | 2.00 | 4.00 | 9.00 | 20.00 | 98% |" in markdown
    assert f"- `{scenarios[1].id}`: health: timeout" in markdown


def test_prometheus_file_sd_per_scenario(tmp_path: Path) -> None:
    scenario = _scenarios()[0]
    path = prometheus_sd.write(tmp_path, "run1", scenario, _handle(scenario))
    assert path == tmp_path / f"run1-{scenario.id}.json"
    assert json.loads(path.read_text()) == [
        {
            "targets": ["127.0.0.1:40001"],
            "labels": {
                "run": "run1",
                "scenario": scenario.id,
                "target": "quart-h2-tls",
                "protocol": "http2",
                "profile": "small",
                "connections": "10x1",
                "churn": "never",
                "compression": "identity",
                "service": "rest_quart",
            },
        }
    ]
    (tmp_path / "other-run-x.json").write_text("[]")
    prometheus_sd.delete_run(tmp_path, "run1")
    assert [p.name for p in tmp_path.iterdir()] == ["other-run-x.json"]


def test_measured_interference_is_in_the_result_flags_it_and_reaches_the_summaries(tmp_path: Path) -> None:
    scenario = _scenarios()[0]
    # 4 s on the service's CPU 1: busy 2.9 s of which the service's own 1.47 s; k6's CPU 0 is quiet.
    window = interference.Window(
        interference.Snapshot(
            10.0, {0: interference.CpuTimes(50.0, 0.0), 1: interference.CpuTimes(40.0, 0.0)}
        ),
        interference.Snapshot(
            14.0, {0: interference.CpuTimes(51.25, 0.0), 1: interference.CpuTimes(41.1, 0.0)}
        ),
        k6_cpu_seconds=2.7,
    )
    handle, usage = _handle(scenario), _usage()
    section = interference.scenario_section(window, handle, usage, None)
    result = _built(replace(_outcome(scenario), host=section))
    assert result["host"]["interference"]["service_cpus"]["others_cpu_seconds"] == pytest.approx(1.43)
    assert result["host"]["interference"]["k6_cpus"]["share"] == pytest.approx(0.0125)
    flagged = [r for r in result["suspect"] if "host interference" in r]
    assert flagged == [
        "other processes used 35.8% of the service's CPUs 1 (1.43 CPU s) during the measured window "
        "(> 5%): host interference"
    ]
    write_json_atomic(result_path(tmp_path, scenario.id), result)
    write_json_atomic(
        tmp_path / "manifest.json",
        {
            "calibration": {
                "before": {"cpu_seconds_per_unit": 0.0004, "kernel": {"cpu_seconds_per_unit": 0.00001}},
                "after": {"cpu_seconds_per_unit": 0.0006, "kernel": {"cpu_seconds_per_unit": 0.00003}},
            }
        },
    )
    write_summaries(tmp_path, "run1", [scenario.id])
    [row] = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    assert float(row["others_service_cpus_share"]) == pytest.approx(0.3575)
    assert float(row["others_k6_cpus_share"]) == pytest.approx(0.0125)
    # 1.47 CPU s over 3000 requests = 0.49 ms per request = 0.98 units of 0.5 ms.
    assert float(row["service_cpu_per_request_cal"]) == pytest.approx(0.98)
    # The same 0.49 ms in kernel units of 20 us; 1.05 of 1.47 CPU s in user space.
    assert float(row["service_cpu_per_request_kcal"]) == pytest.approx(24.5)
    assert float(row["service_user_cpu_share"]) == pytest.approx(0.714, abs=1e-3)
    assert result["service"]["usage"]["system_cpu_seconds"] == pytest.approx(0.42)
    markdown = (tmp_path / "summary.md").read_text()
    assert "| 35.8% / 1.2% | 0.0% | 0.980 | 24.500 | 71% |" in markdown
    # Without a measured window nothing is flagged and the figure says why.
    quiet = _built(replace(_outcome(scenario), host=interference.scenario_section(None, handle, usage, None)))
    assert quiet["host"]["reason"] == "no measured k6 run"
    assert not [r for r in quiet["suspect"] if "interference" in r]


def test_the_userspace_relays_cpu_reaches_the_summaries_as_part_of_others_on_k6s_cpus(tmp_path: Path) -> None:
    scenario = _scenarios()[0]
    # k6's CPU 0 busy 1.25 s of 4 s: k6's own 0.25 s, the relay 0.8 s of the other 1.0 s.
    window = interference.Window(
        interference.Snapshot(
            10.0, {0: interference.CpuTimes(50.0, 0.0), 1: interference.CpuTimes(40.0, 0.0)}
        ),
        interference.Snapshot(
            14.0, {0: interference.CpuTimes(52.75, 0.0), 1: interference.CpuTimes(41.1, 0.0)}
        ),
        k6_cpu_seconds=0.25,
        relay_cpu_seconds=0.8,
    )
    handle, usage = _handle(scenario), _usage()
    result = _built(
        replace(_outcome(scenario), host=interference.scenario_section(window, handle, usage, None))
    )
    k6_cpus = result["host"]["interference"]["k6_cpus"]
    assert k6_cpus["others_cpu_seconds"] == pytest.approx(1.0)
    assert (k6_cpus["relay_cpu_seconds"], k6_cpus["relay_share"]) == pytest.approx((0.8, 0.2))
    assert any("of which the userspace link emulator 0.80" in r for r in result["suspect"])
    write_json_atomic(result_path(tmp_path, scenario.id), result)
    write_summaries(tmp_path, "run1", [scenario.id])
    [row] = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    assert float(row["relay_k6_cpus_share"]) == pytest.approx(0.2)
    assert "/ 25.0% (relay 20.0%) |" in (tmp_path / "summary.md").read_text()


def test_a_saved_result_is_judged_as_the_scenario_was_even_without_its_stored_verdict() -> None:
    scenario = _scenarios()[0]
    # k6 saturated, an idle service, others on both CPU sets, a search whose limiting step saturated k6.
    window = interference.Window(
        interference.Snapshot(
            10.0, {0: interference.CpuTimes(50.0, 0.0), 1: interference.CpuTimes(40.0, 0.0)}
        ),
        interference.Snapshot(
            14.0, {0: interference.CpuTimes(51.0, 0.0), 1: interference.CpuTimes(41.1, 0.3)}
        ),
        k6_cpu_seconds=2.7,
    )
    base = _outcome(scenario)
    settings = CapacitySearch(slo_p99_ms=100, max_error_rate=0.01, max_steps=4, growth=2.0)
    steps = (
        capacity.Step(1, 100, 10, True, (), 100.0, 5.0, 0.0, 0, 0.4, 0.5),
        capacity.Step(2, 200, 20, False, ("p99 too high",), 150.0, 300.0, 0.0, 0, 0.95, 0.6),
    )
    assert base.k6_run is not None
    search = capacity.Outcome(settings, steps, 100, "at 200/s: p99 too high", base.k6_run)
    outcome = replace(
        base,
        host=interference.scenario_section(window, base.handle, base.usage, None),
        search=search,
        usage=replace(_usage(), cpu_seconds=0.3),  # 20% of its quota: a lower bound
    )
    verdict = judge_outcome(outcome)
    assert verdict.lower_bound == "k6 used 90% of its CPUs"
    assert verdict.suspect == (
        "k6 used 90% of its CPUs (load generator saturated)",
        "service used 20% of its 0.5-CPU quota under a closed model: not CPU-bound, so something else "
        "limited throughput",
        "other processes used 28.2% of the service's CPUs 1 (1.13 CPU s) during the measured window "
        "(> 5%): host interference",
        "other processes used 7.5% of k6's CPUs 0 (0.30 CPU s) during the measured window (> 5%): "
        "host interference",
        "k6 used 95% of its CPUs at 200/s, the rate that failed: the capacity found may be the load "
        "generator's",
    )
    result = build_result(outcome, verdict)
    assert (result["suspect"], result["lower_bound"]) == (list(verdict.suspect), verdict.lower_bound)
    # A result written before the verdict was stored: the same figures, read from the JSON.
    older = {k: v for k, v in json.loads(json.dumps(result)).items() if k not in ("suspect", "lower_bound")}
    assert verdict_of(parse_result(older)) == verdict
    assert verdict_of(parse_result(result)) == verdict
