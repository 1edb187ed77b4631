"""Two engines as two hosts: the service on the lab's engine, k6's instances on another
(PROTOLAB_LOAD_ENGINE); an engine that does not answer fails the run at its start, naming it.
"""

import math
import os
import re
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from labrunner.model.matrix import load_matrix

from tests.e2e.docker_lab import (
    EXIT_OK,
    INFLUXDB,
    INFLUXDB_READER,
    MANAGED,
    PROMETHEUS,
    QUIET,
    EngineEvents,
    docker,
    get_json,
    managed_containers,
    missing,
    quick_benchmark,
    results,
    run_cli,
    start_run,
    unique_run_id,
)
from tests.support import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


# --- Two engines as two hosts: the service on the lab's engine, k6's instances on another -------


def load_engine() -> str:
    """The second engine CI starts as the load host (its own socket, data root and bridge)."""
    url = os.environ.get("PROTOLAB_LOAD_ENGINE", "")
    if not url:
        missing(
            "PROTOLAB_LOAD_ENGINE is not set: the two-engine test needs a second Docker engine as "
            "the load host (CI: .ci/docker-engine.sh start-load)"
        )
    info = run_cli("docker", "-H", url, "info", "--format", "{{.ServerVersion}} {{.NCPU}}", check=False)
    if info.returncode != 0:
        missing(f"the load engine {url} does not answer `docker info` ({info.stderr.strip()[-300:]})")
    return url


def test_the_service_on_one_engine_and_two_k6_instances_on_another(lab: list[str], tmp_path: Path) -> None:
    load = load_engine()
    out = tmp_path / unique_run_id("engines")
    quick_benchmark(out)
    run = start_run(
        out, "--preset", "ci", "--target", "aiohttp-h1-tls,grpc-tls", "--duration", "3s", "--warmup", "1s",
        "--load-engine", load, "--k6-instances", "2",
        "--influxdb", INFLUXDB, "--prometheus", PROMETHEUS,
        "--prometheus-targets", str(ROOT / "prometheus" / "targets"),
    )  # fmt: skip
    service_events, load_events = EngineEvents(run.run_id), EngineEvents(run.run_id, host=load)
    try:
        exit_code = run.wait(timeout=300)
    finally:
        service_events.close()
        load_events.close()
    assert exit_code == EXIT_OK, run.output()
    vus = load_matrix(ROOT / "matrix.toml").load_models["closed"].vus
    found = results(out)
    assert len(found) == 2
    for scenario, result in found.items():
        k6_section, instances = result["k6"], result["k6"]["instances"]
        assert [i["placement"] for i in instances] == [f"engine {load} CPU 0", f"engine {load} CPU 1"]
        merged = k6_section["metrics"]
        assert merged["requests"] == sum(i["metrics"]["requests"] for i in instances) > 0
        assert merged["errors"] == sum(i["metrics"]["errors"] for i in instances) == 0
        assert sum(i["metrics"]["vus_max"] for i in instances) == vus  # the load model's, split
        # Percentiles over every sample both instances copied out of their containers.
        samples = [
            float(line)
            for index in (1, 2)
            for line in (out / "k6" / f"{scenario}.measure.k6-{index}.latency_ms.txt").read_text().split()
        ]
        # One sample per request k6 did not decode: the clock's (k6/lib/common.js).
        assert len(samples) == merged["latency_count"] and 0 < len(samples) < merged["requests"]
        ordered = sorted(samples)
        for key, quantile in (("p50", 0.50), ("p99", 0.99)):
            rank = quantile * (len(ordered) - 1)  # linear interpolation, as k6 and numpy compute it
            low = ordered[math.floor(rank)]
            expected = low + (ordered[math.ceil(rank)] - low) * (rank - math.floor(rank))
            assert merged["latency_ms"][key] == pytest.approx(expected, rel=1e-9)
        # Each instance's InfluxDB points, tagged with its index, hold the requests it counted.
        query = (
            f'SELECT count("value") FROM "protolab_reqs" WHERE "run" = \'{run.run_id}\' '
            f'AND "scenario" = \'{scenario}\' GROUP BY "k6_instance"'
        )
        user, password = INFLUXDB_READER  # auth is on: read as Grafana does
        params = urllib.parse.urlencode({"db": "myk6db", "q": query, "u": user, "p": password})
        answer = get_json(f"{INFLUXDB}/query?{params}")
        counted = {s["tags"]["k6_instance"]: s["values"][0][1] for s in answer["results"][0]["series"]}
        assert counted == {str(i["index"]): i["metrics"]["requests"] for i in instances}
        assert result["host"]["reason"].startswith(f"k6 runs on load engine(s) {load}")
    # k6's containers ran on the load engine only, the services on the lab's; none is left.
    on_load = [name for _, name in load_events.actions("start")]
    # Two scenarios, each a warm-up and a measured run, each two instances.
    assert len(on_load) == 8 and all(re.search(r"-k6-[12]$", name) for name in on_load), on_load
    assert all("-k6" not in name for _, name in service_events.actions("start")), service_events.actions()
    assert managed_containers() == []
    assert docker("-H", load, "ps", "-aq", "--filter", f"label={MANAGED}") == ""


def test_an_engine_that_does_not_answer_fails_the_run_at_start_naming_it(
    lab: list[str], tmp_path: Path
) -> None:
    silent = f"unix://{tmp_path}/no-engine.sock"
    out = tmp_path / unique_run_id("silent")
    run = start_run(out, "--preset", "ci", "--target", "grpc", "--load-engine", silent, *QUIET)
    assert run.wait(timeout=60) == 2
    assert f"error: --backend docker: load engine {silent} did not answer" in run.output()
    assert not (out / "scenarios").exists()
