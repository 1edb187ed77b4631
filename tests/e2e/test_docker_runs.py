"""run_matrix.py --backend docker under a real engine: the ci preset over every target, checked from
outside through the engine (each container's limits), Prometheus and InfluxDB; the floor servers in
their stacks' images; a profile larger than the engine refused before any container.
"""

import json
import math
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.docker import names as docker_names

from tests.e2e.docker_lab import (
    EXIT_FAILED,
    EXIT_OK,
    INFLUXDB,
    INFLUXDB_READER,
    PROMETHEUS,
    QUIET,
    Engine,
    EngineEvents,
    Run,
    get_json,
    profiles,
    quick_benchmark,
    results,
    run_cli,
    start_run,
    unique_run_id,
)
from tests.support import ALL_TARGETS, ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

# The main run: the ci preset (small profile) with a shorter measurement.
MAIN_SELECTION = ("--preset", "ci", "--duration", "2s", "--warmup", "1s")


# --- The main run: the ci preset, every target, containers inspected while they run ---------------


@dataclass
class MainRun:
    run: Run
    exit_code: int
    results: dict[str, dict[str, Any]]
    inspected: dict[str, dict[str, Any]]  # container name -> `docker inspect` as it started
    measured: dict[str, dict[str, Any]]  # scenario -> its service's `docker inspect` as a k6 started
    began: float


@pytest.fixture(scope="module")
def main_run(lab: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[MainRun]:
    out = tmp_path_factory.mktemp("docker") / unique_run_id("ci")
    out.mkdir()
    quick_benchmark(out)
    inspected: dict[str, dict[str, Any]] = {}
    measured: dict[str, dict[str, Any]] = {}

    def inspect(event: dict[str, Any]) -> None:
        found = run_cli("docker", "inspect", event["Actor"]["ID"], check=False)
        if found.returncode == 0:  # a k6 container may be gone already
            container = json.loads(found.stdout)[0]
            inspected[container["Name"].lstrip("/")] = container
        labels = event["Actor"]["Attributes"]
        if labels["protolab.role"] == "k6":  # the warm-up's k6 and the measured one's
            service = run_cli(
                "docker", "ps", "-q", "--filter", f"label=protolab.run={labels['protolab.run']}",
                "--filter", f"label=protolab.scenario={labels['protolab.scenario']}",
                "--filter", "label=protolab.role=service",
            ).stdout.split()  # fmt: skip
            if service:
                measured[labels["protolab.scenario"]] = json.loads(
                    run_cli("docker", "inspect", *service).stdout
                )[0]

    events = EngineEvents(out.name, on_start=inspect)
    began = time.time()
    run = start_run(
        out, *MAIN_SELECTION,
        "--influxdb", INFLUXDB, "--prometheus", PROMETHEUS,
        # compose mounts ./prometheus into its Prometheus, which reads file_sd from targets/
        "--prometheus-targets", str(ROOT / "prometheus" / "targets"),
    )  # fmt: skip
    try:
        exit_code = run.wait(timeout=420)
    finally:
        if run.process.poll() is None:
            run.interrupt()
            run.wait(timeout=60)
        events.close()
    yield MainRun(run, exit_code, results(out), inspected, measured, began)


def test_the_ci_preset_runs_every_target_under_docker_without_errors(main_run: MainRun) -> None:
    assert main_run.exit_code == EXIT_OK, main_run.run.output()
    assert sorted(r["scenario"]["target"] for r in main_run.results.values()) == sorted(ALL_TARGETS)
    for scenario, result in main_run.results.items():
        assert result["status"] == "ok", (scenario, result["failure"])
        assert result["backend"] == "docker" and result["service"]["limits"] == "docker", scenario
        assert result["verification"]["ok"], scenario
        metrics = result["k6"]["metrics"]
        assert metrics["requests"] > 0 and metrics["errors"] == 0, (scenario, metrics)
    manifest = json.loads((main_run.run.out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert manifest["backend"]["name"] == "docker"


def test_each_scenario_container_has_its_profiles_limits(main_run: MainRun, engine: Engine) -> None:
    table = profiles()
    nofile = int(os.environ.get("SERVICE_NOFILE") or docker_names.NOFILE)
    roles: dict[tuple[str, str], dict[str, Any]] = {}
    for container in main_run.inspected.values():
        labels = container["Config"]["Labels"]
        roles[(labels["protolab.scenario"], labels["protolab.role"])] = container
    assert {s for s, _ in roles} == set(main_run.results), roles.keys()
    for scenario, result in main_run.results.items():
        cpus, memory = table[result["scenario"]["profile"]["name"]]
        service, k6 = roles[(scenario, "service")], roles[(scenario, "k6")]
        host, measured = service["HostConfig"], main_run.measured[scenario]["HostConfig"]
        print(  # shown with -s, and with a failure
            f"{scenario}: CpuQuota {host['CpuQuota']} then {measured['CpuQuota']} per CpuPeriod "
            f"{measured['CpuPeriod']}, Memory {host['Memory']} MemorySwap {host['MemorySwap']} cpuset "
            f"{host['CpusetCpus']}, k6 cpuset {k6['HostConfig']['CpusetCpus']}"
        )
        # It starts at its whole CPUs' quota and is measured at its profile's, from the warm-up on.
        assert (host["CpuPeriod"], host["CpuQuota"]) == (100_000, math.ceil(cpus) * 100_000), scenario
        assert (measured["CpuPeriod"], measured["CpuQuota"]) == (100_000, round(cpus * 100_000)), scenario
        assert host["Memory"] == host["MemorySwap"] == memory, (scenario, host["Memory"], host["MemorySwap"])
        service_cpus = host["CpusetCpus"].split(",")
        k6_cpus = k6["HostConfig"]["CpusetCpus"].split(",")
        # ceil(cpus) CPUs for the service, the others for k6 (shared only when there are no others)
        assert len(service_cpus) == math.ceil(cpus), (scenario, host["CpusetCpus"])
        if engine.ncpu > math.ceil(cpus):
            others = {str(c) for c in range(engine.ncpu)} - set(service_cpus)
            assert set(k6_cpus) == others, (scenario, k6_cpus)
        # what the engine enforces is what the result says
        assert service_cpus == [str(c) for c in result["service"]["service_cpus"]], scenario
        assert k6_cpus == [str(c) for c in result["service"]["k6_cpus"]], scenario
        assert k6["Config"]["Image"] == os.environ.get("K6_IMAGE", docker_names.K6_IMAGE), scenario
        for container in (service, k6):
            assert [(u["Name"], u["Soft"], u["Hard"]) for u in container["HostConfig"]["Ulimits"]] == [
                ("nofile", nofile, nofile)
            ], scenario


def test_prometheus_scraped_every_scenario_container(main_run: MainRun) -> None:
    window = math.ceil(time.time() - main_run.began) + 10
    query = (
        f'max by (scenario, target, profile) (max_over_time(up{{run="{main_run.run.run_id}"}}[{window}s]))'
    )
    answer = get_json(f"{PROMETHEUS}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
    series = {s["metric"]["scenario"]: s for s in answer["data"]["result"]}
    print(f"{query}: {sorted((k, s['value'][1]) for k, s in series.items())}")
    assert set(series) == set(main_run.results), series.keys()
    for scenario, s in series.items():
        wanted = main_run.results[scenario]["scenario"]
        assert s["value"][1] == "1", (scenario, s)
        assert s["metric"]["target"] == wanted["target"], (scenario, s)
        assert s["metric"]["profile"] == wanted["profile"]["name"], (scenario, s)


def _influx_counts(query: str) -> dict[str, Any]:
    """Per scenario, the count a GROUP BY "scenario" query gives, read as InfluxDB's reader (auth is on)."""
    user, password = INFLUXDB_READER
    params = urllib.parse.urlencode({"db": "myk6db", "q": query, "u": user, "p": password})
    answer = get_json(f"{INFLUXDB}/query?{params}")
    return {s["tags"]["scenario"]: s["values"][0][1] for s in answer["results"][0].get("series", [])}


def test_influxdb_holds_as_many_requests_per_scenario_as_k6_counted(main_run: MainRun) -> None:
    # k6 and the runner write as InfluxDB's writer: what is there was written with its credentials.
    run = f'WHERE "run" = \'{main_run.run.run_id}\' GROUP BY "scenario"'
    counted = _influx_counts(f'SELECT count("value") FROM "protolab_reqs" {run}')
    expected = {scenario: r["k6"]["metrics"]["requests"] for scenario, r in main_run.results.items()}
    print(f"protolab_reqs per scenario, InfluxDB: {sorted(counted.items())}; k6: {sorted(expected.items())}")
    assert counted == expected
    marks = _influx_counts(f'SELECT count("event") FROM "protolab_scenario" {run}')
    assert marks == dict.fromkeys(expected, 2), "each scenario's start and end annotation"


def test_the_floor_servers_run_in_their_stacks_images(lab: list[str], tmp_path: Path) -> None:
    out = tmp_path / unique_run_id("floor")
    quick_benchmark(out)
    selection = ("--preset", "floor", "--target", "floor-aiohttp-h1,floor-grpc", "--response-model", "build")
    run = start_run(out, *selection, "--repeats", "1", "--duration", "1s", "--warmup", "0", *QUIET)
    assert run.wait(timeout=180) == EXIT_OK, run.output()
    found = results(out)
    assert sorted(r["scenario"]["target"] for r in found.values()) == ["floor-aiohttp-h1", "floor-grpc"]
    for scenario, result in found.items():
        assert result["status"] == "ok" and result["verification"]["ok"], (scenario, result["failure"])
        assert result["k6"]["metrics"]["requests"] > 0 and result["k6"]["metrics"]["errors"] == 0, scenario


def test_a_profile_larger_than_the_engine_is_refused_before_any_container(
    lab: list[str], engine: Engine, tmp_path: Path
) -> None:
    profile_args: tuple[str, ...] = ("--profile", "p2")
    cpus, _ = profiles()["p2"]
    if cpus <= engine.ncpu:  # an engine with 4 CPUs or more: a profile that cannot fit there
        cpus = float(engine.ncpu * 2)
        matrix = tmp_path / "matrix.toml"
        extra = f'\n[profiles.p2x]\ncpus = {cpus}\nmemory = "1g"\n'
        matrix.write_text((ROOT / "matrix.toml").read_text() + extra)
        profile_args = ("--matrix", str(matrix), "--profile", "p2x")
    out = tmp_path / unique_run_id("toolarge")
    quick_benchmark(out)
    selection = ("--preset", "ci", "--target", "grpc", "--duration", "1s", "--warmup", "0")
    run = start_run(out, *selection, *profile_args, *QUIET)
    events = EngineEvents(run.run_id)
    try:
        exit_code = run.wait(timeout=120)
    finally:
        events.close()
    assert exit_code == EXIT_FAILED, run.output()
    message = f"profile {profile_args[-1]} asks for {cpus:g} CPUs; the Docker engine has {engine.ncpu}"
    [result] = results(out).values()
    assert (result["failure"]["phase"], result["failure"]["message"]) == ("start", message)
    assert f"FAILED in start: {message}" in run.output()
    assert events.actions() == [], "a container was created for a profile that cannot fit"
