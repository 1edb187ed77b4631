"""Unit tests: k6 split into instances (k6_instances): matrix validation, execution segments,
the split invocation, the merged result and its suspect flag, and the refusals."""

import copy
import itertools
import random
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from labrunner.backends.base import (
    BackendSettings,
    BackendUnavailable,
    Endpoint,
    K6Invocation,
    ScenarioFailed,
    ServiceHandle,
)
from labrunner.backends.local import LocalBackend
from labrunner.cli import run_matrix as cli
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import LoadModel, Overrides, Scenario
from labrunner.model.schema import MatrixError
from labrunner.results.record import build_result, judge_outcome
from labrunner.run.k6.invocation import K6Setup
from labrunner.run.k6.merge import merge_exit_codes, merge_runs
from labrunner.run.k6.output import take_latency_samples
from labrunner.run.k6.result import K6Run
from labrunner.run.k6.segments import execution_segments, instances_for
from labrunner.run.k6_stats import latency_stats
from labrunner.run.outcome import ScenarioOutcome

from tests.support import ROOT

MATRIX = ROOT / "matrix.toml"
# latency_ms's percentiles and numpy's q for each: p99.9 since the trend statistics have p(99.9).
PERCENTILES = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("p99.9", 99.9))
# What a one-k6 result's k6 section holds: a split adds "instances" and nothing else.
ONE_K6_KEYS = {
    "exit_code",
    "wall_seconds",
    "cpu_seconds",
    "cpus",
    "cpu_utilisation",
    "placement",  # None here: one k6 on this host (issue 15 added it for k6 on another engine)
    "metrics",
    "summary_metrics",
    "output_tail",
}


def _scenario(**overrides: Any) -> Scenario:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("aiohttp-h1",), **overrides))
    return plan.scenarios[0]


def _settings(tmp_path: Path) -> BackendSettings:
    return BackendSettings("run1", ROOT, tmp_path, tmp_path, Path("k6"), 10.0, 10.0)


def _handle(k6_cpus: tuple[int, ...] = (0, 1)) -> ServiceHandle:
    address = Endpoint("127.0.0.1", 8080)
    return ServiceHandle("s", "rest_aiohttp", address, address, None, None, 1, "cgroup-v2", (3,), k6_cpus)


def _invocation(
    tmp_path: Path, warmup: bool, instances: int, k6_cpus: Sequence[int] = (0, 1)
) -> K6Invocation:
    setup = K6Setup(
        _scenario(),
        _handle(tuple(k6_cpus)),
        run_id="r1",
        root=ROOT,
        ca_file=tmp_path / "ca.pem",
        k6_dir=tmp_path / "k6",
        log_file=tmp_path / "logs" / "s.k6.log",
        influxdb_url="http://127.0.0.1:8086",
        instances=instances,
    )
    return setup.warmup() if warmup else setup.window()


def _summary(requests: int, failed: int = 0, seconds: float = 3.0, vus: int = 5) -> dict[str, Any]:
    """The shape of k6's handleSummary data; the latency values are placeholders merging ignores."""
    attempts = requests + failed
    return {
        "metrics": {
            "protolab_reqs": {"values": {"count": requests, "rate": requests / seconds}},
            "protolab_req_failed": {
                "values": {"rate": failed / attempts, "passes": failed, "fails": requests},
                "thresholds": {"rate<0.01": {"ok": failed / attempts < 0.01}},
            },
            "protolab_req_duration": {
                "values": {
                    "avg": 1.0,
                    "p(50)": 1.0,
                    "p(90)": 1.0,
                    "p(95)": 1.0,
                    "p(99)": 1.0,
                    "max": 1.0,
                    "count": requests,
                }
            },
            "data_received": {"values": {"count": requests * 100, "rate": requests * 100 / seconds}},
            "iterations": {"values": {"count": attempts, "rate": attempts / seconds}},
            "checks": {"values": {"passes": 3, "fails": 0}},
            "vus_max": {"values": {"max": vus}},
        },
        "state": {"testRunDurationMs": seconds * 1000},
    }


def _instance(
    requests: int, samples: Sequence[float] | None, cpu_seconds: float, seconds: float = 3.0, **kw: Any
) -> K6Run:
    return K6Run(
        kw.pop("exit_code", 0),
        _summary(requests, seconds=seconds, **kw),
        wall_seconds=seconds + 0.2,
        cpu_seconds=cpu_seconds,
        cpus=1,
        output_tail="",
        latency_samples=None if samples is None else tuple(samples),
    )


# --- matrix and command line ------------------------------------------------------------


def test_k6_instances_defaults_to_one_and_accepts_a_count_or_auto() -> None:
    assert {s.k6_instances for s in expand(load_matrix(MATRIX), "local", "ci").scenarios} == {1}
    assert _scenario(k6_instances=3).k6_instances == 3
    assert _scenario(k6_instances="auto").k6_instances == "auto"
    # Not part of the scenario id: the load model is the same, only split.
    assert _scenario(k6_instances=2).id == _scenario().id


@pytest.mark.parametrize("value", [0, -1, "two", True, 1.5, "AUTO"])
def test_invalid_k6_instances_name_the_key(value: object) -> None:
    with pytest.raises(MatrixError, match=r"k6_instances: .* must be an integer >= 1 or 'auto'"):
        _scenario(k6_instances=value)


def test_k6_instances_in_the_file_per_preset_and_backend() -> None:
    data = tomllib.loads(MATRIX.read_text())
    data["presets"]["ci"]["local"] = {"k6_instances": "auto"}
    data["presets"]["ci"]["k6_instances"] = 2
    matrix = parse_matrix(data, MATRIX)
    assert {s.k6_instances for s in expand(matrix, "local", "ci").scenarios} == {"auto"}
    assert {s.k6_instances for s in expand(matrix, "docker", "ci").scenarios} == {2}
    bad = copy.deepcopy(data)
    bad["presets"]["ci"]["k6_instances"] = 0
    with pytest.raises(
        MatrixError, match=r"^\[presets.ci\] k6_instances: 0 must be an integer >= 1 or 'auto'"
    ):
        parse_matrix(bad, MATRIX)


def test_command_line_k6_instances(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--dry-run", "--preset", "ci", "--backend", "local", "--target", "aiohttp-h1"]
    assert cli.main([*argv, "--k6-instances", "auto"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-2:] == ["k6", "instances"] and out[2].split()[-1] == "auto"
    assert cli.main([*argv, "--k6-instances", "0"]) == cli.EXIT_USAGE
    assert "k6_instances: 0 must be an integer >= 1 or 'auto'" in capsys.readouterr().err
    assert cli.main([*argv, "--k6-instances", "many"]) == cli.EXIT_USAGE
    assert "--k6-instances takes an integer >= 1 or 'auto', got 'many'" in capsys.readouterr().err
    # One k6 (the default): the dry run's table is as before.
    assert cli.main(argv) == 0
    assert "k6" not in capsys.readouterr().out.splitlines()[1].split()


def test_preflight_refuses_more_instances_than_k6_cpus_on_this_host(tmp_path: Path) -> None:
    matrix = load_matrix(MATRIX)
    backend = LocalBackend(_settings(tmp_path))
    too_many = expand(matrix, "local", "ci", Overrides(targets=("aiohttp-h1",), k6_instances=999))
    with pytest.raises(BackendUnavailable, match=r"k6_instances = 999 needs 999 CPUs for k6, one per"):
        cli._check_k6_instances(too_many, backend)
    for fine in (1, "auto"):
        cli._check_k6_instances(expand(matrix, "local", "ci", Overrides(k6_instances=fine)), backend)


# --- execution segments and the split invocation -----------------------------------------


def test_execution_segment_strings() -> None:
    assert execution_segments(1) == ("0,1", ("0:1",))
    assert execution_segments(2) == ("0,1/2,1", ("0:1/2", "1/2:1"))
    assert execution_segments(3) == ("0,1/3,2/3,1", ("0:1/3", "1/3:2/3", "2/3:1"))
    sequence, segments = execution_segments(7)
    assert len(segments) == 7 and sequence.count(",") == 7
    # The segments tile the sequence: each ends where the next starts.
    assert all(a.split(":")[1] == b.split(":")[0] for a, b in itertools.pairwise(segments))
    with pytest.raises(ValueError):
        execution_segments(0)


def test_one_instance_keeps_todays_invocation(tmp_path: Path) -> None:
    one = _invocation(tmp_path, warmup=False, instances=1)
    assert one.instances == () and one.segment is None and one.cpus is None and one.raw_file is None
    assert "--execution-segment" not in one.args and not any(a.startswith("csv=") for a in one.args)
    assert one.summary_file == tmp_path / "k6" / f"{_scenario().id}.measure.json"


@pytest.mark.parametrize("warmup", [False, True])
def test_split_invocation_has_a_segment_cpu_summary_and_log_per_instance(
    tmp_path: Path, warmup: bool
) -> None:
    whole = _invocation(tmp_path, warmup=warmup, instances=3, k6_cpus=(4, 5, 6, 7))
    stem = f"{_scenario().id}.{'warmup' if warmup else 'measure'}"
    assert len(whole.instances) == 3
    for index, (instance, segment, cpu) in enumerate(
        zip(whole.instances, ("0:1/3", "1/3:2/3", "2/3:1"), (4, 5, 6), strict=True), start=1
    ):
        args = list(instance.args)
        assert args[: len(whole.args)] == list(whole.args)  # the same run, then the split
        assert args[args.index("--execution-segment") + 1] == segment == instance.segment
        assert args[args.index("--execution-segment-sequence") + 1] == "0,1/3,2/3,1"
        assert f"k6_instance={index}" in args
        assert instance.cpus == (cpu,)
        assert instance.summary_file == tmp_path / "k6" / f"{stem}.k6-{index}.json"
        assert instance.env["SUMMARY_FILE"] == str(instance.summary_file)
        assert instance.log_file == tmp_path / "logs" / f"s.k6-{index}.log"
        # Raw samples only where percentiles are merged: the measured run.
        raw = tmp_path / "k6" / f"{stem}.k6-{index}.csv"
        assert instance.raw_file == (None if warmup else raw)
        assert (f"csv={raw}" in args) is not warmup
        assert {k: v for k, v in instance.env.items() if k != "SUMMARY_FILE"} == {
            k: v for k, v in whole.env.items() if k != "SUMMARY_FILE"
        }


# --- how many instances -----------------------------------------------------------------


def test_instances_for_auto_explicit_and_refusals() -> None:
    closed = LoadModel("closed", "constant-vus", vus=10)
    assert instances_for("auto", (0, 1, 2), closed) == 3
    assert instances_for("auto", (0, 1, 2), replace(closed, vus=2)) == 2  # VUs cap it
    assert instances_for(1, (0,), closed) == 1
    assert instances_for(2, (0, 1), closed) == 2
    with pytest.raises(
        ScenarioFailed,
        match=r"k6_instances = 3 needs 3 CPUs for k6, one per instance; k6's side is CPU 0,1, so k6 has 2",
    ):
        instances_for(3, (0, 1), closed)
    with pytest.raises(ScenarioFailed, match=r"load model seq has 1 VUs to share"):
        instances_for(2, (0, 1), LoadModel("seq", "shared-iterations", vus=1, iterations=100))


# --- merging --------------------------------------------------------------------------


def test_latency_stats_match_numpy_and_k6s_method() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(1.0, 0.8) for _ in range(1001)]
    stats = latency_stats(samples)
    for key, q in PERCENTILES:
        assert stats[key] == pytest.approx(float(np.percentile(samples, q)), rel=1e-12)
    assert stats["avg"] == pytest.approx(float(np.mean(samples)), rel=1e-12)
    assert stats["max"] == max(samples)
    assert latency_stats([4.0]) == dict.fromkeys(("avg", "p50", "p90", "p95", "p99", "p99.9", "max"), 4.0)
    assert set(latency_stats([]).values()) == {None}


def test_merged_run_sums_counts_and_takes_percentiles_over_all_samples() -> None:
    # Two instances with different latency: averaging their p99s would give neither figure.
    fast = [0.5 + i / 1000 for i in range(600)]
    slow = [5.0 + i / 100 for i in range(400)]
    runs = [
        _instance(600, fast, cpu_seconds=1.5, vus=3),
        _instance(400, slow, cpu_seconds=2.7, seconds=3.1, vus=2, failed=4),
    ]
    merged = merge_runs(runs)
    metrics = merged.metrics
    assert metrics is not None
    assert (metrics.requests, metrics.errors, metrics.attempts) == (1000, 4, 1004)
    assert metrics.error_rate == pytest.approx(4 / 1004)
    assert metrics.vus_max == 5 and metrics.iterations == 1004 and metrics.checks_passed == 6
    assert metrics.test_run_seconds == 3.1
    assert metrics.requests_per_second == pytest.approx(1000 / 3.1)
    assert metrics.data_received_bytes == 100_000
    everything = fast + slow
    for key, q in PERCENTILES:
        assert metrics.latency_ms[key] == pytest.approx(float(np.percentile(everything, q)), rel=1e-12)
    assert metrics.latency_ms["p99"] != pytest.approx((np.percentile(fast, 99) + np.percentile(slow, 99)) / 2)
    assert metrics.latency_ms["max"] == max(slow)
    # k6's CPU: summed, over both CPUs; the busiest instance decides saturation.
    assert (merged.cpu_seconds, merged.cpus) == (pytest.approx(4.2), 2)
    assert merged.cpu_utilisation == pytest.approx(2.7 / 3.1)
    assert merged.summary is None and merged.exit_code == 0


def test_merged_run_without_samples_keeps_only_exact_latency() -> None:
    runs = [_instance(300, None, cpu_seconds=1.0), _instance(100, None, cpu_seconds=1.0)]
    latency = merge_runs(runs).metrics.latency_ms  # type: ignore[union-attr]
    assert latency["avg"] == pytest.approx(1.0) and latency["max"] == 1.0
    assert latency["p99.9"] is None and latency["p99"] is None and latency["p50"] is None


def test_an_instance_whose_raw_output_misses_samples_fails_the_merge() -> None:
    runs = [_instance(3, [1.0, 2.0, 3.0], cpu_seconds=1.0), _instance(3, [1.0, 2.0], cpu_seconds=1.0)]
    with pytest.raises(
        ScenarioFailed,
        match="k6 instance 2: its raw output holds 2 protolab_req_duration samples, its summary 3",
    ):
        merge_runs(runs)


def test_an_instance_without_a_summary_leaves_no_merged_metrics() -> None:
    broken = K6Run(107, None, wall_seconds=1.0, cpu_seconds=0.1, cpus=1, output_tail="boom")
    merged = merge_runs([_instance(3, [1.0, 2.0, 3.0], cpu_seconds=1.0), broken])
    assert merged.metrics is None and merged.exit_code == 107
    assert "[k6 instance 2 of 2, segment None]\nboom" in merged.output_tail


def test_merged_exit_code() -> None:
    assert merge_exit_codes([0, 0]) == 0
    assert merge_exit_codes([0, 99]) == 99
    assert merge_exit_codes([99, 107, 0]) == 107


def test_raw_csv_gives_its_latency_samples_and_is_replaced(tmp_path: Path) -> None:
    raw = tmp_path / "s.k6-1.csv"
    raw.write_text(
        "metric_name,timestamp,metric_value,check,error,error_code,expected_response,method,proto,"
        "status,extra_tags,metadata\n"
        "http_req_duration,1,1.250000,,,,true,GET,HTTP/1.1,200,decoded=no,\n"
        "http_req_duration,1,9.000000,,,,true,GET,HTTP/1.1,200,decoded=yes,\n"
        "http_req_duration,1,7.000000,,,,false,GET,HTTP/1.1,500,decoded=no,\n"
        "protolab_req_duration,1,1.300000,,,,,,,,,\n"
        "http_req_duration,2,0.125001,,,,true,GET,HTTP/1.1,200,decoded=no&k6_instance=1,\n"
    )
    clock = "http_req_duration{decoded:no,expected_response:true}"
    assert take_latency_samples(raw, clock) == [1.25, 0.125001]
    assert not raw.exists()
    assert tmp_path.joinpath("s.k6-1.latency_ms.txt").read_text().split() == ["1.25", "0.125001"]
    assert take_latency_samples(tmp_path / "missing.csv", clock) == []


# --- the result JSON -----------------------------------------------------------------------


def _built(outcome: ScenarioOutcome) -> dict[str, Any]:
    """The result the session writes: the outcome with the judge's verdict."""
    return build_result(outcome, judge_outcome(outcome))


def _outcome(run: K6Run) -> ScenarioOutcome:
    scenario = _scenario()
    return ScenarioOutcome(
        run_id="run1",
        backend="local",
        scenario=scenario,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        finished_at=datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC),
        failure=None,
        handle=_handle(),
        verification=None,
        k6_run=run,
        usage=None,
        timings_s={},
    )


def test_one_instance_result_keeps_its_keys() -> None:
    result = _built(_outcome(_instance(10, None, cpu_seconds=0.3)))
    assert set(result["k6"]) == ONE_K6_KEYS
    assert "k6_instances" not in result["scenario"]


def test_split_result_reports_each_instance_and_flags_any_saturated_one() -> None:
    runs = [
        replace(_instance(600, [1.0] * 600, cpu_seconds=2.7), segment="0:1/2", cpu_ids=(0,)),  # 90%
        replace(_instance(400, [2.0] * 400, cpu_seconds=0.9), segment="1/2:1", cpu_ids=(1,)),  # 30%
    ]
    result = _built(_outcome(merge_runs(runs)))
    section = result["k6"]
    assert set(section) == ONE_K6_KEYS | {"instances"}
    assert section["metrics"]["requests"] == 1000
    assert section["cpu_utilisation"] == pytest.approx(0.9)
    assert [(i["index"], i["segment"], i["cpus"], i["latency_samples"]) for i in section["instances"]] == [
        (1, "0:1/2", [0], 600),
        (2, "1/2:1", [1], 400),
    ]
    assert [round(i["cpu_utilisation"], 2) for i in section["instances"]] == [0.9, 0.3]
    assert [i["metrics"]["requests"] for i in section["instances"]] == [600, 400]
    saturated = [r for r in result["suspect"] if "k6" in r]
    assert saturated == ["k6 instance 1 of 2 used 90% of its CPU 0 (load generator saturated)"]
    calm = [replace(runs[0], cpu_seconds=1.2), runs[1]]
    assert not [r for r in _built(_outcome(merge_runs(calm)))["suspect"] if "k6" in r]
