"""The docker backend's scenarios through the runner on the thin fake client (tests/docker_fake.py),
with a real HTTP server behind the published ports for health and verification; and the link
probe over real sockets."""

import contextlib
import io
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import DockerException, NotFound
from docker.types import Ulimit
from labrunner.backends.docker import DockerBackend
from labrunner.cli import session
from labrunner.network import docker_probe
from labrunner.run.k6.invocation import summary_trend_stats

from tests.docker_fake import (
    MEMORY_PEAK,
    SERVICE_IP,
    FakeContainer,
    FakeDocker,
    docker_stats,
    flow_plan,
    k6_writes_its_summary,
    quick_polls_and_compose_defaults,
    records_published,
    run_config,
    settings,
)
from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


@pytest.fixture
def fake() -> FakeDocker:
    return FakeDocker()


@pytest.fixture
def published_service(fake: FakeDocker) -> Iterator[FakeDocker]:
    with records_published(fake):
        yield fake


@pytest.fixture(autouse=True)
def _quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)


def test_k6_container_parameters(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service
    fake.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    ok = session.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )
    assert not ok  # no summary from the fake k6; the parameters are what this test is about
    warmup = fake.created[1].params
    results = tmp_path / "out" / "k6"
    assert warmup == {
        "image": "grafana/k6:1.1.0",
        "command": [
            "run",
            "--quiet",
            "--no-color",
            "--address",
            "",
            "--summary-trend-stats",
            summary_trend_stats(),  # k6/lib/trend_stats.json, as the script's summaryTrendStats
            "--tag",
            "run=run1",
            "--tag",
            "scenario=aiohttp-h1.p1.c3.closed.r1",
            "--tag",
            "target=aiohttp-h1",
            "--tag",
            "protocol=http1.1",
            "--tag",
            "profile=p1",
            "--tag",
            "connections=10x1",
            "--tag",
            "churn=never",
            "--tag",
            "compression=identity",
            "/k6/rest.js",
        ],
        "name": "protolab-run1-aiohttp-h1-p1-c3-closed-r1-k6",
        "environment": {
            "K6_NO_USAGE_REPORT": "true",
            "SUMMARY_FILE": "/results/aiohttp-h1.p1.c3.closed.r1.warmup.json",
            "COUNT": "3",
            "SHAPE": "cars",
            "TLS": "0",
            "DURATION": "1s",
            "LOAD_MODEL": "constant-vus",
            "VUS": "10",
            "BASE_URL": "http://rest-aiohttp:8081",
            "EXPECT_PROTO": "HTTP/1.1",
            "GODEBUG": "http2client=0",
        },
        "network": "protolab",
        "extra_hosts": {"rest-aiohttp": SERVICE_IP},
        "cpuset_cpus": "0,1,2,3,4,5",
        "user": f"{os.getuid()}:{os.getgid()}",
        "labels": {
            "protolab.managed": "true",
            "protolab.run": "run1",
            "protolab.scenario": "aiohttp-h1.p1.c3.closed.r1",
            "protolab.target": "aiohttp-h1",
            "protolab.profile": "p1",
            "protolab.role": "k6",
        },
        "volumes": {
            str(ROOT / "k6"): {"bind": "/k6", "mode": "ro"},
            str(ROOT / "proto"): {"bind": "/proto", "mode": "ro"},
            "protolab-certs": {"bind": "/certs", "mode": "ro"},
            str(results): {"bind": "/results", "mode": "rw"},
        },
        "ulimits": [Ulimit(name="nofile", soft=65536, hard=65536)],
    }
    measured = fake.created[2].params
    assert measured["command"][-3:] == ["--out", "influxdb=http://influxdb:8086/myk6db", "/k6/rest.js"]
    assert measured["environment"]["SUMMARY_FILE"] == "/results/aiohttp-h1.p1.c3.closed.r1.measure.json"


def engine_request(params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The create request the real docker SDK would send the Engine API for these parameters."""
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.45")
    sent: dict[str, Any] = {}

    def capture(config: dict[str, Any], name: str, platform: str | None = None) -> None:
        sent.update(config, Name=name)
        raise NotFound("captured, not sent")

    monkeypatch.setattr(client.api, "create_container_from_config", capture)
    with pytest.raises(NotFound, match="captured"):
        client.containers.create(**params)
    return sent


def test_the_real_sdk_turns_the_parameters_into_the_engine_request(
    tmp_path: Path, published_service: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = published_service
    fake.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    session.run_plan(flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None)
    service = engine_request(fake.created[0].params, monkeypatch)
    host = service["HostConfig"]
    assert (host["CpuPeriod"], host["CpuQuota"]) == (100_000, 200_000)  # p1's 2 CPUs, whole at start
    assert (host["Memory"], host["MemorySwap"]) == (2 * 2**30, 2 * 2**30)
    assert (host["CpusetCpus"], host["NetworkMode"], host["Binds"]) == (
        "6,7",
        "protolab",
        ["protolab-certs:/certs:ro"],
    )
    assert host["PortBindings"] == {
        "8081/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}],
        "9101/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}],
    }
    assert host["Ulimits"] == [{"Name": "nofile", "Soft": 65536, "Hard": 65536}]
    assert (host["Init"], host["ReadonlyRootfs"], host["CapDrop"]) == (True, True, ["ALL"])
    assert service["Healthcheck"]["Test"] == ["NONE"]
    assert service["Labels"]["protolab.managed"] == "true"
    k6_request = engine_request(fake.created[1].params, monkeypatch)
    assert k6_request["HostConfig"]["ExtraHosts"] == [f"rest-aiohttp:{SERVICE_IP}"]
    assert f"{ROOT / 'k6'}:/k6:ro" in k6_request["HostConfig"]["Binds"]
    assert "PortBindings" not in k6_request["HostConfig"]  # k6 publishes nothing


def test_scenario_through_the_runner_collects_usage_and_removes_everything(
    tmp_path: Path, published_service: FakeDocker
) -> None:
    fake = published_service
    fake.service_stats = [
        docker_stats(10.0, 100, 5, 0.25, usage=50_000_000, limit=2 * 2**30),
        docker_stats(13.5, 120, 9, 0.75, usage=60_000_000, limit=2 * 2**30),  # cgroup v2: no max_usage
    ]
    fake.k6_stats = [
        [docker_stats(0.4, 0, 0, 0)],
        [docker_stats(0.9, 0, 0, 0), docker_stats(1.2, 0, 0, 0), docker_stats(0.0, 0, 0, 0)],
    ]
    file_sd: list[Any] = []

    def k6_runs(container: FakeContainer) -> None:
        k6_writes_its_summary(container)
        file_sd.extend(json.loads(p.read_text()) for p in (tmp_path / "targets").glob("*.json"))

    fake.on_k6_start = k6_runs
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    assert session.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )

    [result_file] = (tmp_path / "out" / "scenarios").glob("*.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "ok", result["failure"]
    usage = result["service"]["usage"]
    assert usage["cpu_seconds"] == pytest.approx(3.5)
    assert (usage["cpu_periods"], usage["throttled_periods"]) == (20, 4)
    assert usage["throttled_seconds"] == pytest.approx(0.5)
    assert (usage["memory_peak_bytes"], usage["memory_peak_scope"]) == (MEMORY_PEAK, "lifetime")
    assert (usage["memory_limit_bytes"], usage["cpu_limit_cores"], usage["exit_code"]) == (2 * 2**30, 2.0, 0)
    # The last sample before the exit is the total; a stopped container's zero is not.
    assert result["k6"]["cpu_seconds"] == pytest.approx(1.2)
    assert result["k6"]["cpus"] == 6
    assert result["service"]["limits"] == "docker"
    name = "protolab-run1-aiohttp-h1-p1-c3-closed-r1"
    assert file_sd[-1] == [
        {
            "targets": [f"{name}:9101"],
            "labels": {
                "run": "run1",
                "scenario": "aiohttp-h1.p1.c3.closed.r1",
                "target": "aiohttp-h1",
                "protocol": "http1.1",
                "profile": "p1",
                "connections": "10x1",
                "churn": "never",
                "compression": "identity",
                "service": "rest_aiohttp",
            },
        }
    ]
    assert ("stop", name, 20) in fake.calls
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert all(force for call, _, force in (c for c in fake.calls if c[0] == "remove"))
    assert (
        (tmp_path / "out" / "logs" / "aiohttp-h1.p1.c3.closed.r1.service.log")
        .read_bytes()
        .endswith(b"service stderr\n")
    )
    assert b"k6 output" in (tmp_path / "out" / "logs" / "aiohttp-h1.p1.c3.closed.r1.k6.log").read_bytes()


def test_error_mid_scenario_removes_service_and_k6(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service

    def k6_fails(container: FakeContainer) -> None:
        raise DockerException("k6 image is broken")

    fake.on_k6_start = k6_fails
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    assert not session.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )
    [result_file] = (tmp_path / "out" / "scenarios").glob("*.json")
    failure = json.loads(result_file.read_text())["failure"]
    assert (failure["phase"], failure["message"]) == ("warmup", "docker: k6 image is broken")
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert len(fake.created) == 2


def test_ctrl_c_removes_service_and_k6(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service

    def interrupted(container: FakeContainer) -> None:
        raise KeyboardInterrupt

    fake.on_k6_start = interrupted
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        session.run_plan(
            flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
        )
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert [c.role for c in fake.created] == ["service", "k6"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"] is False


@pytest.mark.serial  # it measures a rate; beside the docker phase's load the probe failed once
def test_the_link_probe_measures_rtt_and_rate_over_real_sockets() -> None:
    """docker_probe.py runs alone in the helper image: serve and measure over loopback here."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = threading.Thread(target=docker_probe.serve, args=(port, 5.0), daemon=True)
    server.start()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = docker_probe.main(
            ["measure", "--host", "127.0.0.1", "--port", str(port), "--samples", "5", "--rate-seconds", "0.4",
             "--mtu", "1500"]
        )  # fmt: skip
    server.join(10)
    assert code == 0 and not server.is_alive()  # the server ends with its bulk transfer
    measured = json.loads(out.getvalue().splitlines()[-1])
    assert measured["event"] == "measured" and measured["address"] == "127.0.0.1"
    assert len(measured["rtt_s"]) == 5 and all(0 < rtt < 0.05 for rtt in measured["rtt_s"])
    # Loopback: above any profile's rate (narrow: 10 Mbit/s), even with both ends of this one Python
    # process starved of CPU on a busy host.
    assert measured["rate_bps"] > 20e6
    # Nobody listening: a failure line, not a traceback.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setattr(docker_probe, "_CONNECT_RETRY_S", 0.2)
        assert (
            docker_probe.main(["measure", "--host", "127.0.0.1", "--port", str(port), "--samples", "1"]) == 1
        )
    assert json.loads(out.getvalue())["event"] == "failed"
