"""End to end, the connection model: run_matrix.py --streams 1,5 on the local backend with real k6 and
real HTTP/2 and gRPC servers runs each target at 10 connections of one request and at 2 connections of
5 requests at once, and the service's own namespace counted exactly the planned connections in the
warm-up and the measured window; HTTP/1.1 beside them runs at one stream only, said once."""

from pathlib import Path

import pytest

from tests.e2e.local_runs import finished_run

# Connections counted and results written, no figure judged.
pytestmark = [pytest.mark.e2e, pytest.mark.paired]
SELECTION = (
    "--backend", "local", "--preset", "ci", "--target", "aiohttp-h1,quart-h2-tls,grpc", "--count", "10",
    "--load-model", "closed", "--repeats", "1", "--duration", "2s", "--warmup", "2s", "--streams", "1,5",
    "--duet", "off",
)  # fmt: skip


def test_each_connection_model_runs_with_the_connections_it_plans(tmp_path: Path) -> None:
    # The run id names its cgroups: unique among the paired phase.
    output, results = finished_run(tmp_path / "connection-model-run", *SELECTION)
    assert "HTTP/1.1 cannot multiplex: aiohttp-h1 run at 1 stream per connection only" in output
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
        assert result["scenario"]["streams"] == (5 if planned == 2 else 1)
        connections = result["connections"]
        assert connections["planned"] == planned, scenario_id
        assert connections["seen"] == {"warmup": planned, "measured window": planned}, scenario_id
        assert connections["dialed"] == planned, scenario_id  # each connection dialed once, then kept
        metrics = result["k6"]["metrics"]
        assert metrics["requests"] > 0 and metrics["errors"] == 0
