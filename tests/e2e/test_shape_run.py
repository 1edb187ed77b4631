"""End to end, one shape beside cars: run_matrix.py --shape numeric on the local backend with real k6
(REST and gRPC streaming, a second each) starts each service with SHAPE=numeric, verifies its bytes
against the pool's numeric records before measuring, measures, and writes results whose scenario
says numeric under ids that end in .numeric."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from labrunner.files import write_json_atomic
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization

from tests.support import QUICK_CALIBRATION, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.paired]  # bytes verified and results written, no figure judged
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")
SELECTION = (
    "--backend", "local", "--preset", "ci", "--target", "aiohttp-h1,grpc-stream", "--count", "10",
    "--load-model", "closed", "--repeats", "1", "--duration", "1s", "--warmup", "0",
)  # fmt: skip


def _run_matrix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_numeric_run_verifies_measures_and_records_its_shape(tmp_path: Path) -> None:
    out = tmp_path / "numeric-run"  # the run id names its cgroups: unique among the paired phase
    out.mkdir()
    # The serialization benchmark is not under test here: a quick one in place.
    write_json_atomic(out / "serialization.json", as_document(run_serialization(QUICK), QUICK))
    completed = _run_matrix(*SELECTION, *QUIET, "--shape", "numeric", "--out", str(out))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = {path.stem: json.loads(path.read_text()) for path in (out / "scenarios").glob("*.json")}
    assert set(results) == {
        "aiohttp-h1.small.c10.closed.numeric.r1",
        "grpc-stream.small.c10.closed.numeric.r1",
    }
    for scenario_id, result in results.items():
        assert result["status"] == "ok" and result["scenario"]["shape"] == "numeric", scenario_id
        checks = result["verification"]["checks"]
        calls = ("ListRecords", "StreamRecords") if "grpc" in scenario_id else ("REST /records",)
        for call in calls:
            assert any(
                check.startswith(f"{call}: the pool's records (canonical checksum") for check in checks
            )
        assert result["k6"]["metrics"]["requests"] > 0
