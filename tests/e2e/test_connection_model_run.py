"""End to end, the connection model: run_matrix.py --streams 1,5 on the local backend with real k6 and
real HTTP/2 and gRPC servers runs each target at 10 connections of one request and at 2 connections of
5 requests at once, and the service's own namespace counted exactly the planned connections in the
warm-up and the measured window; HTTP/1.1 beside them runs at one stream only, said once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from labrunner.files import write_json_atomic
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization

from tests.support import QUICK_CALIBRATION, ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.paired,
]  # connections counted and results written, no figure judged
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")
SELECTION = (
    "--backend", "local", "--preset", "ci", "--target", "aiohttp-h1,quart-h2-tls,grpc", "--count", "10",
    "--load-model", "closed", "--repeats", "1", "--duration", "2s", "--warmup", "2s", "--streams", "1,5",
    "--duet", "off",
)  # fmt: skip


def test_each_connection_model_runs_with_the_connections_it_plans(tmp_path: Path) -> None:
    out = tmp_path / "connection-model-run"  # the run id names its cgroups: unique among the paired phase
    out.mkdir()
    write_json_atomic(out / "serialization.json", as_document(run_serialization(QUICK), QUICK))
    completed = subprocess.run(
        [sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION, *SELECTION, *QUIET, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "HTTP/1.1 cannot multiplex: aiohttp-h1 run at 1 stream per connection only" in completed.stdout
    results = {path.stem: json.loads(path.read_text()) for path in (out / "scenarios").glob("*.json")}
    assert set(results) == {
        "aiohttp-h1.small.c10.closed.r1",
        "quart-h2-tls.small.c10.closed.r1",
        "grpc.small.c10.closed.r1",
        "quart-h2-tls.small.c10.closed.2x5.r1",
        "grpc.small.c10.closed.2x5.r1",
    }
    for scenario_id, result in results.items():
        assert result["status"] == "ok", (scenario_id, result["failure"])
        planned = 2 if scenario_id.endswith(".2x5.r1") else 10
        assert result["scenario"]["connections"] == planned
        assert result["connections"] == {
            "planned": planned,
            "seen": {"warmup": planned, "measured window": planned},
        }, scenario_id
        metrics = result["k6"]["metrics"]
        assert metrics["requests"] > 0 and metrics["errors"] == 0
