"""End to end, HTTP/3: run_matrix.py --preset http3 on the local backend, as root, with the real Python
driver, the real Hypercorn serving QUIC, on loopback and through the emulated lossy link (the
userspace relay carries UDP): every scenario ran, over the protocol it was planned for, the h3 link's
UDP RTT was verified, and the findings answer HTTP/3 against HTTP/2 and HTTP/1.1."""

import os
from pathlib import Path

import pytest

from tests.e2e.local_runs import finished_run

# Scenarios run and results written; no figure judged (the eighth profile keeps the driver light).
pytestmark = [pytest.mark.e2e, pytest.mark.paired]
SELECTION = (
    "--backend", "local", "--preset", "http3", "--profile", "eighth", "--repeats", "1",
    "--duration", "2s", "--warmup", "1s",
)  # fmt: skip
PROTOCOL = {"quart-h1-tls-py": "HTTP/1.1", "quart-h2-tls-py": "HTTP/2.0", "quart-h3": "HTTP/3"}


def test_the_http3_preset_runs_each_version_on_both_links_and_answers(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the lossy link needs root (CAP_NET_ADMIN): run the tests as root"
    out = tmp_path / "http3-run"  # the run id names its cgroups: unique among the paired phase
    output, results = finished_run(out, *SELECTION)
    seen = set()
    for scenario_id, result in results.items():
        assert result["status"] == "ok", (scenario_id, result["failure"])
        target, network = result["scenario"]["target"], result["scenario"]["network"]["name"]
        seen.add((target, network))
        assert result["verification"]["protocol"] == PROTOCOL[target], scenario_id
        assert result["k6"]["metrics"]["errors"] == 0
        if network == "lossy" and target == "quart-h3":
            assert result["network"]["measured_udp_rtt_s"] is not None, scenario_id
    assert seen == {(t, n) for t in PROTOCOL for n in ("loopback", "lossy")}
    report = (out / "report.md").read_text()
    assert "quart-h3 vs quart-h2-tls-py" in report and "quart-h3 vs quart-h1-tls-py" in report
    assert "Traceback" not in output
