"""Network scenarios end to end, local backend, as root: grpc-tls over the emulated 50 ms `wan`
link, and over `lan` with a real Prometheus scraping the service at its 198.18.x address."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from labrunner.network.emulators import kernel_has_netem
from labrunner.network.namespaces import create_link, hold, plan_link, remove_leftovers, remove_link
from labrunner.observe import local_stack

from tests.e2e.local_runs import quick_benchmark
from tests.support import QUICK_CALIBRATION, ROOT, free_ports


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
    quick_benchmark(out)  # the serialization benchmark is not under test here (test_e2e_local's run has it)
    completed = subprocess.run(
        [
            sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
            "--backend", "local", "--preset", "ci",
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


def _query_range(prometheus: str, query: str, began: datetime, ended: datetime) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode(
        {"query": query, "start": began.timestamp(), "end": ended.timestamp(), "step": "1"}
    )
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=10) as response:
        series: list[dict[str, Any]] = json.load(response)["data"]["result"]
    return series


def test_prometheus_scrapes_the_service_across_the_namespaces_on_lan(tmp_path: Path) -> None:
    """Prometheus (a host process) scrapes the service at 198.18.x during a `lan` scenario; the
    userspace relay's CPU over the measured window is in the result, as interference on k6's CPUs."""
    targets = tmp_path / "targets"
    targets.mkdir()
    urls = local_stack.start(tmp_path / "obs", targets_dir=targets, ports=local_stack.Ports(*free_ports(3)))
    try:
        run_id = f"netprom-{os.getpid()}"
        out = tmp_path / run_id
        quick_benchmark(out)  # not under test here (test_e2e_local's run has it)
        began = datetime.now(UTC)
        completed = subprocess.run(
            [
                sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
                "--backend", "local", "--preset", "ci",
                # A 3 s warm-up: the last scrape (every 2 s) can come up to 2 s before the service
                # stops, and the warm-up's requests, counted too, must outnumber those 2 s.
                "--target", "grpc-tls", "--network", "lan", "--duration", "4s", "--warmup", "3s",
                "--run-id", run_id, "--out", str(out), "--influxdb", "none",
                "--prometheus", urls["prometheus"], "--prometheus-targets", str(targets),
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        time.sleep(4)  # two scrape intervals: the last samples reach the TSDB
        ended = datetime.now(UTC)
        assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
        # The runner waited for a scrape after the measured window before stopping the service.
        assert "did not scrape" not in completed.stdout, completed.stdout[-4000:]
        [path] = (out / "scenarios").glob("*.json")
        result = json.loads(path.read_text())
        assert result["status"] == "ok", result["failure"]
        scenario = result["scenario_id"]
        assert scenario == "grpc-tls.small.c100.closed.lan.r1"
        address = result["network"]["service_address"]
        assert address.startswith("198.18.")
        assert result["service"]["prometheus_target"].startswith(f"{address}:")
        labels = f'run="{run_id}", scenario="{scenario}"'

        up = _query_range(urls["prometheus"], f"up{{{labels}}}", began, ended)
        assert up, f"no up series for {labels}"
        assert {s["metric"]["instance"] for s in up} == {result["service"]["prometheus_target"]}
        assert max(float(v) for s in up for _, v in s["values"]) == 1.0

        handled = _query_range(
            urls["prometheus"],
            f'sum by (instance) (grpc_server_handled_total{{{labels}, grpc_code="OK"}})',
            began,
            ended,
        )
        assert handled, "no gRPC request counter scraped for the scenario"
        assert {s["metric"]["instance"] for s in handled} == {result["service"]["prometheus_target"]}
        most = max(float(v) for s in handled for _, v in s["values"])
        assert most >= result["k6"]["metrics"]["requests"] > 0  # warm-up requests count too

        # The userspace relay (this kernel has no netem) ran on k6's CPUs during the measured run.
        if result["network"]["emulator"] == "userspace":
            relay_s = result["network"]["relay_cpu_s"]
            assert result["network"]["relay_cpus"] == result["service"]["k6_cpus"]
            assert relay_s > 0
            k6_cpus = result["host"]["interference"]["k6_cpus"]
            assert k6_cpus["relay_cpu_seconds"] == pytest.approx(relay_s, abs=1e-3)
            # The relay is not k6's own time: it sits inside others on k6's CPUs.
            assert k6_cpus["others_cpu_seconds"] >= relay_s - 0.05 * k6_cpus["capacity_cpu_seconds"]
            assert "(relay " in (out / "summary.md").read_text()
    finally:
        local_stack.stop(tmp_path / "obs")
