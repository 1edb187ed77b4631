"""Preset caller's parts that decide what a user reads: which measurements a caller plan makes and in
which order, the figures and verdict of a measurement, the findings' sentences and pairs, and the checks
every caller's verification and upload records rest on."""

import itertools
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import MEASURES, Overrides
from labrunner.model.schema import MeasureName
from labrunner.report import callers as report
from labrunner.report.document import Table
from labrunner.report.runs import load_run
from labrunner.report.stats import Ratio
from labrunner.results.callers import build_result
from labrunner.results.store import RESULT_SCHEMA, result_path
from labrunner.results.trust import caller_lower_bound, caller_suspect
from labrunner.run.callers import CallerOutcome, Measurement, measurements, run_order

from services.common import caller_loop
from services.common.records import Car, Driver, Record, checksum
from tests.support import ROOT, latency_from_p50, ok_result

MATRIX = ROOT / "matrix.toml"
WHEN = datetime(2026, 12, 4, tzinfo=UTC)
# The preset's targets and the client each is called with (matrix.toml [presets.caller]).
CALLED = {"aiohttp-h1": "aiohttp_h1", "grpc": "grpc_aio", "granian-h2-tls": "httpx_h2"}


def _planned(**overrides: Any) -> tuple[Measurement, ...]:
    return measurements(expand(load_matrix(MATRIX), "local", "caller", Overrides(**overrides)))


def test_the_matrix_knows_every_measured_subject() -> None:
    assert typing.get_args(MeasureName) == MEASURES


def test_a_caller_plan_measures_each_target_with_its_protocols_client_lab_and_floor() -> None:
    planned = _planned(repeats=1, directions=("download", "upload"))
    seen = {(m.scenario.target.name, m.module, m.scenario.direction) for m in planned}
    assert seen == {
        (target, f"{package}.{client}", direction)
        for target, client in CALLED.items()
        for package in ("labrunner.callers", "benchmarks.callers")
        for direction in ("download", "upload")
    }
    assert {(m.scenario.profile.cpus, m.concurrency, m.scenario.count) for m in planned} == {(0.25, 10, 100)}
    assert len({m.id for m in planned}) == len(planned) == 12


def test_every_round_runs_whole_before_the_next_each_in_an_order_of_its_seed() -> None:
    planned = _planned(repeats=3)
    order = run_order(planned, seed=7)
    rounds = [m.scenario.repeat for m in order]
    assert rounds == sorted(rounds) and sorted(m.id for m in order) == sorted(m.id for m in planned)
    assert [m.id for m in run_order(planned, seed=7)] == [m.id for m in order]
    first_rounds = {tuple(m.id for m in run_order(planned, seed)[: len(planned) // 3]) for seed in range(5)}
    assert len(first_rounds) > 1  # the seed, not the plan, orders a round


def test_a_load_model_without_fixed_calls_in_flight_is_refused() -> None:
    with pytest.raises(ValueError, match="constant-vus"):
        _planned(load_models=("open",))


def _outcome(
    measurement: Measurement,
    cpu_per_call_us: float,
    *,
    server_share: float = 0.2,
    verified: int = 42,
    calls: int = 1000,
    seconds: float = 2.0,
) -> CallerOutcome:
    cpu = cpu_per_call_us * calls / 1e6
    return CallerOutcome(
        measurement,
        (0,),
        ready={"event": "ready", "checksum": verified},
        measured={
            "event": "measured",
            "calls": calls,
            "seconds": seconds,
            "cpu_seconds": cpu,
            "user_seconds": cpu * 0.75,
            "system_seconds": cpu * 0.25,
            "periods": 20,
            "throttled_periods": 10,
        },
        server_cpu_seconds=server_share * seconds,
        server_cpu_limit=1.0,
        exit_code=0,
    )


def test_a_results_figures_are_per_call_per_record_and_shares_of_each_quota() -> None:
    m = _planned(repeats=1)[0]
    result = build_result(_outcome(m, 400.0, server_share=0.3), 42, WHEN, WHEN)
    f = result["figures"]
    assert result["status"] == "ok"
    assert f["cpu_per_call_us"] == pytest.approx(400.0)
    assert f["cpu_per_record_us"] == pytest.approx(4.0)  # 100 records a call
    assert f["calls_per_s"] == pytest.approx(500.0)
    assert f["user_share"] == pytest.approx(0.75)
    assert f["quota_share"] == pytest.approx(0.4 / (2.0 * 0.25))
    assert f["server_cpu_share"] == pytest.approx(0.3)
    assert f["server_cpu_per_call_us"] == pytest.approx(600.0)
    assert result["lower_bound"] is None


def test_a_caller_that_verified_other_records_than_the_pools_failed() -> None:
    m = _planned(repeats=1)[0]
    result = build_result(_outcome(m, 400.0, verified=41), 42, WHEN, WHEN)
    assert result["status"] == "failed"
    assert "41" in result["error"] and "42" in result["error"] and not result["verified"]["equal_work"]


def test_a_busy_server_or_an_idle_caller_makes_calls_per_second_a_lower_bound() -> None:
    assert caller_lower_bound(0.51, 0.99) == "the server used 51% of its CPU"
    assert caller_lower_bound(0.49, 0.99) is None
    assert caller_lower_bound(0.2, 0.49) == "the caller used 49% of its quota"
    assert caller_lower_bound(None, None) is None


def test_others_steal_and_failed_calls_above_their_thresholds_make_a_window_suspect() -> None:
    assert caller_suspect(0.04, 0.04, 0.01) == []
    reasons = caller_suspect(0.06, 0.07, 0.02)
    assert len(reasons) == 3
    assert "6.0%" in reasons[0] and "7.0%" in reasons[1] and "2.00%" in reasons[2]


def _groups(cpu: dict[str, list[float]], server_share: float = 0.2) -> list[report.CallerGroup]:
    """Lab and floor groups of the preset's download measurements; `cpu` the CPU per call of each
    round by '<target>.<variant>'."""
    results = [
        build_result(_outcome(m, cpu[key][m.scenario.repeat - 1], server_share=server_share), 42, WHEN, WHEN)
        for m in _planned(repeats=3, directions=("download",))
        if (key := f"{m.scenario.target.name}.{m.variant}") in cpu
    ]
    return report.groups_of(results)


def test_the_findings_name_every_pair_of_lab_callers_and_each_against_its_floor() -> None:
    rounds = [1.0, 1.02, 0.98]
    per_call = {"aiohttp-h1": 300.0, "grpc": 180.0, "granian-h2-tls": 900.0}
    cpu = {}
    for target, per_round in per_call.items():  # the lab's harness 10% over its floor, every round
        cpu[f"{target}.floor"] = [per_round * r for r in rounds]
        cpu[f"{target}.lab"] = [per_round * r * 1.1 for r in rounds]
    sentences = [f.sentence for f in report.findings(_groups(cpu))]
    order = list(CALLED)  # matrix order: each target against every one before it
    for i, j in itertools.combinations(range(3), 2):
        assert any(
            s.startswith(f"calling {order[j]} from Python cost the caller ")
            and s.endswith(f"the CPU of calling {order[i]}, 100 records, download.")
            for s in sentences
        ), (order[j], order[i])
    for target in order:
        assert f"the lab's {target} caller cost 1.10x [1.10, 1.10] the CPU per call of its floor" in " ".join(
            sentences
        )
    assert len(sentences) == 6


def test_a_significant_ratio_reads_as_a_cost_with_its_interval() -> None:
    cpu = {"aiohttp-h1.lab": [1000.0, 1040.0, 980.0], "grpc.lab": [600.0, 640.0, 570.0]}
    (finding,) = report.findings(_groups(cpu))
    assert finding.sentence.startswith("calling grpc from Python cost the caller 0.60x [")
    assert finding.sentence.endswith("] the CPU of calling aiohttp-h1, 100 records, download.")
    assert finding.held_fixed == "the lab's callers, on the quarter profile (0.25 CPU), 10 calls in flight"
    assert finding.effect > 0


def test_a_lower_bound_is_said_beside_the_ratio() -> None:
    cpu = {"aiohttp-h1.lab": [1000.0, 1040.0, 980.0], "grpc.lab": [600.0, 640.0, 570.0]}
    (finding,) = report.findings(_groups(cpu, server_share=0.6))
    assert "grpc (lab): calls/s only a lower bound, the server used 60% of its CPU" in finding.caveat


@pytest.mark.parametrize(
    ("r", "words"),
    [
        (Ratio(0.6, 0.55, 0.66, 0.001, True, equivalent=False), "0.60x [0.55, 0.66]"),
        (Ratio(1.01, 0.97, 1.04, 0.5, False, equivalent=True), "1.01x [0.97, 1.04] (equivalent within ±10%)"),
        (Ratio(1.2, 0.8, 1.7, 0.3, False, equivalent=False), "1.20x [0.80, 1.70] (inconclusive)"),
        (
            Ratio(1.2, 1.05, 1.4, 0.03, False, note=report.CORRECTED_AWAY, equivalent=False),
            "1.20x [1.05, 1.40] (inconclusive after correction)",
        ),
        (Ratio(1.46, None, None, None, None, "n/a: one repeat"), "1.46x (n/a: one repeat)"),
    ],
)
def test_each_verdict_has_its_words(r: Ratio, words: str) -> None:
    assert report.describe_cost(r) == words


def test_a_group_without_a_successful_repeat_is_in_no_ratio_and_said() -> None:
    m = _planned(repeats=1, directions=("download",))[0]
    failed = build_result(CallerOutcome(m, (0,), error="the caller failed: boom"), 42, WHEN, WHEN)
    found = report.findings(report.groups_of([failed]))
    assert [f.sentence for f in found] == [
        f"{m.scenario.target.name} (lab, 100 records, download): no successful repeat of 1, in no ratio."
    ]


def test_a_main_runs_server_side_of_the_same_call_stands_beside_the_callers(tmp_path: Path) -> None:
    """A main run's closed-model group of aiohttp-h1 at 100 records: 0.25 CPU s per 1,000 requests is
    250 µs a request, beside the lab caller's 300 µs a call."""
    main = expand(load_matrix(MATRIX), "local", "default", Overrides(targets=("aiohttp-h1",), repeats=2))
    for scenario in main.scenarios:
        if scenario.load_model.name == "closed":
            result = ok_result(
                scenario,
                requests=4000,
                rps=400.0,
                latency_ms=latency_from_p50(2.0),
                received_bytes=4000 * 18_000,
                window_s=10.0,
                cpu_seconds=1.0,  # 1 CPU s over 4,000 requests: 250 µs each
                quota_used=0.4,
            )
            write_json_atomic(result_path(tmp_path, scenario.id), result | {"schema": RESULT_SCHEMA})
    groups = _groups({"aiohttp-h1.lab": [300.0, 300.0, 300.0], "grpc.lab": [200.0, 200.0, 200.0]})
    blocks = report.server_side(groups, load_run(tmp_path))
    (table,) = [b for b in blocks if isinstance(b, Table)]
    assert [row[:5] + row[6:] for row in table.rows] == [
        ("aiohttp-h1", "download", "100", "300", "250", "550", "55%")
    ]


POOL = [
    Record(Car("Ford", "Focus", "S", "red", 2001 + i, 1000 * i), Driver("Ann", "Lee", f"DRV-{i}"))
    for i in range(5)
]


def test_upload_batches_rotate_through_the_pool_count_records_a_call() -> None:
    batches = caller_loop.Batches(POOL, 3)
    taken = [batches.next() for _ in range(4)]
    assert [[r.driver.driver_id for r in batch] for batch in taken] == [
        ["DRV-0", "DRV-1", "DRV-2"],
        ["DRV-3", "DRV-4", "DRV-0"],
        ["DRV-1", "DRV-2", "DRV-3"],
        ["DRV-4", "DRV-0", "DRV-1"],
    ]


def test_a_download_verifies_only_the_pools_first_records_field_for_field() -> None:
    assert caller_loop.verify_download(POOL[:3], POOL, 3) == checksum(POOL[:3])
    swapped = [POOL[0], Record(POOL[1].car, Driver("Lee", "Ann", "DRV-1")), POOL[2]]
    with pytest.raises(caller_loop.Mismatch, match="record 1 differs"):
        caller_loop.verify_download(swapped, POOL, 3)
    with pytest.raises(caller_loop.Mismatch, match="2 records decoded"):
        caller_loop.verify_download(POOL[:2], POOL, 3)


def test_an_upload_verifies_the_replys_count_and_checksum_against_what_was_sent() -> None:
    assert caller_loop.verify_upload(3, checksum(POOL[:3]), POOL[:3]) == checksum(POOL[:3])
    with pytest.raises(caller_loop.Mismatch, match="count 2"):
        caller_loop.verify_upload(2, checksum(POOL[:3]), POOL[:3])
    with pytest.raises(caller_loop.Mismatch, match="checksum"):
        caller_loop.verify_upload(3, checksum(POOL[:3]) + 1, POOL[:3])
