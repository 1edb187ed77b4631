"""End to end, churn and compression: run_matrix.py --churn never,2 --compression identity,gzip on the
local backend with real k6 and real servers: a churned scenario's k6 dialed a new connection every 2
calls (the runner's check passed and the result keeps the count), a kept one dialed each VU's once; a
compressed scenario's responses took fewer bytes than the same target's uncompressed ones; the run's
report has the connections section."""

from pathlib import Path

import pytest

from tests.e2e.local_runs import finished_run

# Connections dialed and bytes counted, results written: no timing judged.
pytestmark = [pytest.mark.e2e, pytest.mark.paired]
VUS = 10
SELECTION = (
    "--backend", "local", "--preset", "ci", "--target", "aiohttp-h1-tls,grpc", "--count", "100",
    "--load-model", "closed", "--repeats", "1", "--duration", "2s", "--warmup", "1s",
    "--churn", "never,2", "--compression", "identity,gzip", "--duet", "off",
)  # fmt: skip


def test_churned_scenarios_dial_every_n_calls_and_compressed_ones_send_fewer_bytes(tmp_path: Path) -> None:
    out = tmp_path / "churn-compression-run"  # the run id names its cgroups: unique among the paired phase
    _, results = finished_run(out, *SELECTION)
    assert set(results) == {
        f"{target}.small.c100.closed{churn}{compression}.r1"
        for target in ("aiohttp-h1-tls", "grpc")
        for churn in ("", ".churn2")
        for compression in ("", ".gzip")
    }
    bytes_per_call: dict[tuple[str, str], list[float]] = {}
    for scenario_id, result in results.items():
        assert result["status"] == "ok", (scenario_id, result["failure"])
        scenario, metrics = result["scenario"], result["k6"]["metrics"]
        dialed, attempts = result["connections"]["dialed"], metrics["attempts"]
        if scenario["churn"] is None:
            assert dialed == VUS, scenario_id
        else:
            assert scenario["churn"] == 2
            assert attempts // 2 <= dialed <= attempts / 2 + VUS, scenario_id
        key = (scenario["target"], scenario["compression"])
        bytes_per_call.setdefault(key, []).append(metrics["data_received_bytes"] / metrics["requests"])
    for target, ratio in (("aiohttp-h1-tls", 0.5), ("grpc", 0.75)):
        assert max(bytes_per_call[(target, "gzip")]) < ratio * min(bytes_per_call[(target, "identity")]), (
            target
        )
    report = (out / "report.md").read_text()
    assert "## Connections: churn and compression" in report
