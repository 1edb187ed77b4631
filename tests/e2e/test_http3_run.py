"""End to end, HTTP/3: run_matrix.py --preset http3 on the local backend, as root, with the real Python
driver, the real Hypercorn serving QUIC, on loopback and through the emulated lossy link (the
userspace relay carries UDP): every scenario ran, over the protocol it was planned for, the h3 link's
UDP RTT was verified, and the findings answer HTTP/3 against HTTP/2 and HTTP/1.1 (or name the side
that was only a lower bound)."""

import os
import re
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
    for baseline in ("quart-h2-tls-py", "quart-h1-tls-py"):
        # The pair's finding, or the line that says why there is none: a side whose driver took more
        # than 80% of its CPU share is a lower bound and enters no ratio. In 2 s windows the driver's
        # start (0.11-0.30 s of CPU, counted as k6's start is) can take it there beside another test.
        bound = re.compile(
            rf"^- ({baseline} \(eighth, 100 records, beside quart-h3\)|quart-h3 \(eighth, 100 records, "
            rf"beside {baseline}\)): throughput only a lower bound",
            re.M,
        )
        assert f"quart-h3 vs {baseline}" in report or bound.search(report), baseline
    assert "Traceback" not in output
