"""Payload sizes and the serialization micro-benchmark (the services' own bodies:
tests/integration/test_payload_bodies.py)."""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest
from labrunner.report import payload, serialization
from labrunner.report.serialization import QUICK, Budget, measure_case

from services.common.pb import cars_pb2
from services.common.pool import DEFAULT_SHAPE, SHAPES
from services.common.shapes import SHAPE_KITS
from tests.support import ROOT


def test_payload_rows_cover_every_count_and_protobuf_is_smaller() -> None:
    rows = payload.measure()
    assert [r.count for r in rows] == [1, 10, 100, 1000]
    for row in rows:
        assert 0 < row.protobuf_bytes < row.json_bytes
        if row.count >= 10:  # gzip's header outweighs the saving on a single record
            assert row.json_gzip_bytes < row.json_bytes and row.protobuf_gzip_bytes < row.protobuf_bytes
    document = json.loads(json.dumps(payload.as_document(rows)))
    assert payload.rows_from_document(document) == rows
    assert payload.rows_from_document({"schema": "other"}) == []


def test_every_codec_encodes_the_same_body() -> None:
    cases = serialization.workloads(10)
    assert set(cases) == {(c, o) for c in serialization.CODECS for o in serialization.OPERATIONS}
    orjson_body = cases["orjson", "encode"][0]()
    assert cases["json", "encode"][0]() == orjson_body
    assert cases["json", "decode"][0]() == cases["orjson", "decode"][0]() == orjson.loads(orjson_body)
    decoded = cases["protobuf", "decode"][0]()
    assert isinstance(decoded, cars_pb2.ListRecordsResponse) and len(decoded.records) == 10
    assert cases["protobuf", "encode"][0]() == decoded.SerializeToString()


def test_measure_case_calibrates_iterations_to_the_budget() -> None:
    budget = Budget(counts=(1,), iterations=4, iteration_s=0.002, warmup_s=0.001)
    calls = []
    ops, samples = measure_case(lambda: calls.append(1), budget)
    assert len(samples) == 4 and ops > 1
    assert all(0 < s < 0.002 for s in samples)  # per operation, well under an iteration
    assert len(calls) >= 4 * ops


def test_quick_benchmark_reports_geometric_means_with_positive_intervals() -> None:
    cases = serialization.run(QUICK)
    assert len(cases) == len(QUICK.counts) * 6
    sizes = {r.count: r for r in payload.measure(QUICK.counts)}
    for case in cases:
        assert case.n == QUICK.iterations
        assert 0 < case.min_us <= case.geomean_us <= case.max_us
        assert case.low_us is not None and case.high_us is not None
        assert 0 < case.low_us <= case.geomean_us <= case.high_us
        row = sizes[case.count]
        assert case.bytes == (row.protobuf_bytes if case.codec == "protobuf" else row.json_bytes)
    document = serialization.as_document(cases, QUICK)
    assert document["quick"] is True and document["protobuf_backend"] in ("upb", "cpp", "python")
    assert serialization.cases_from_document(json.loads(json.dumps(document))) == cases


def test_bench_serialization_runs_on_its_own(tmp_path: Path) -> None:
    out = tmp_path / "serialization.json"
    completed = subprocess.run(
        [sys.executable, "scripts/bench_serialization.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "protobuf  decode" in completed.stdout and "geomean us" in completed.stdout
    assert json.loads(out.read_text())["schema"] == serialization.SCHEMA


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != DEFAULT_SHAPE])
def test_each_shape_is_sized_and_benchmarked_on_its_own_records(shape: str) -> None:
    rows = payload.measure((10,), shape)
    [cars] = payload.measure((10,))
    assert rows[0].json_bytes != cars.json_bytes  # the shape's own bodies, not cars'
    cases = serialization.workloads(10, shape)
    decoded = cases["protobuf", "decode"][0]()
    assert isinstance(decoded, SHAPE_KITS[shape].list_message) and len(decoded.records) == 10
    # A shape's map fields (orders) serialise in no fixed order: its bytes are compared as messages.
    assert type(decoded).FromString(cases["protobuf", "encode"][0]()) == decoded
    assert cases["orjson", "encode"][1] == rows[0].json_bytes
    budget = Budget(counts=(10,), iterations=2, iteration_s=0.001, warmup_s=0.0)
    ran = serialization.run(budget, (DEFAULT_SHAPE, shape))
    assert [c.shape for c in ran] == [DEFAULT_SHAPE] * 6 + [shape] * 6
    assert (
        serialization.cases_from_document(json.loads(json.dumps(serialization.as_document(ran, budget))))
        == ran
    )


def test_a_shape_payload_does_not_know_has_no_sizes_and_old_cases_are_cars() -> None:
    assert not payload.measurable("user") and payload.measure((10,), "user") == []
    [case] = serialization.run(Budget(counts=(1,), iterations=1, iteration_s=0.0, warmup_s=0.0))[:1]
    written = {k: v for k, v in asdict(case).items() if k != "shape"}  # a file from before shapes
    [read] = serialization.cases_from_document({"schema": serialization.SCHEMA, "cases": [written]})
    assert read.shape == DEFAULT_SHAPE
