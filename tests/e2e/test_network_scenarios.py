"""A network scenario end to end: grpc-tls over the emulated 50 ms `wan` link, local backend, as root."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from labrunner.network.emulators import kernel_has_netem
from labrunner.network.namespaces import create_link, hold, plan_link, remove_leftovers, remove_link

from tests.support import ROOT


@pytest.fixture(autouse=True)
def _root() -> None:
    # Never skipped: without root these fail and say why (scripts/test.sh runs as root in CI).
    assert os.geteuid() == 0, "network scenarios need root (CAP_NET_ADMIN): run the tests as root"


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True)
    return [entry["name"] for entry in json.loads(listed.stdout.strip() or "[]")]


def test_grpc_tls_over_wan(tmp_path: Path) -> None:
    run_id = f"nete2e-{os.getpid()}"
    out = tmp_path / run_id
    completed = subprocess.run(
        [
            sys.executable, "scripts/run_matrix.py", "--backend", "local", "--preset", "ci",
            "--target", "grpc-tls", "--network", "wan", "--duration", "3s", "--warmup", "1s",
            "--run-id", run_id, "--out", str(out), "--influxdb", "none", "--prometheus", "none",
            "--prometheus-targets", "",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    [path] = (out / "scenarios").glob("*.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["failure"]
    assert result["scenario_id"] == "grpc-tls.small.c100.closed.wan.r1"
    assert result["scenario"]["network"]["name"] == "wan"
    network = result["network"]
    assert network["profile"] == "wan"
    # This kernel has no sch_netem; where it has, the lab picks netem.
    assert network["emulator"] in ("userspace", "netem")
    if not kernel_has_netem():
        assert network["emulator"] == "userspace"
    assert network["measured_rtt_s"] == pytest.approx(0.050, rel=0.10)
    # Every request waits out at least one 50 ms round trip.
    assert result["k6"]["metrics"]["latency_ms"]["p50"] > 50
    assert result["service"]["address"].startswith("198.18.0.1:")
    # Removed after the scenario: nothing of this run is left.
    assert [ns for ns in _namespaces() if run_id in ns] == []


def test_leftovers_spare_a_link_another_run_holds() -> None:
    prefix = f"protolab-t{os.getpid()}-"  # this test's own: never a run's or another test's
    link = create_link(plan_link("hold", "s1", prefix=prefix))
    try:
        held = hold(link)
        assert not set(remove_leftovers(prefix, keep_in_use=True)) & set(link.namespaces)
        assert set(link.namespaces) <= set(_namespaces())
        for fd in held:
            os.close(fd)
        assert set(link.namespaces) <= set(remove_leftovers(prefix, keep_in_use=True))
        assert not set(link.namespaces) & set(_namespaces())
    finally:
        remove_link(link)
