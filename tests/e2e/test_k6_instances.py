"""k6 split into instances, end to end on the local backend: run_matrix.py with real k6 and a real
aiohttp service on 127.0.0.1, two k6 processes per scenario by execution segments, for a closed
(constant-vus), an open (constant-arrival-rate) and a shared-iterations load model.

Checked against k6's own numbers: the merged requests are the sum of the instances', the merged
percentiles equal numpy's over the concatenated raw samples (and each instance's samples give
that instance's own k6 percentiles back), and the instances' VUs add up to the load model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from labrunner.backends.cgroups import split_cpus
from labrunner.model.scenario import LoadModel

from tests.support import QUICK_CALIBRATION, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.paired]  # k6 against its own samples

INSTANCES = 2
CLOSED_VUS = 5  # odd: the segments split it 3 + 2
OPEN_RATE, OPEN_VUS = 200, 4
SHARED_VUS, SHARED_ITERATIONS = 3, 600
MODELS = {
    "closed": LoadModel("closed", "constant-vus", vus=CLOSED_VUS),
    "open": LoadModel(
        "open", "constant-arrival-rate", rate=OPEN_RATE, pre_allocated_vus=OPEN_VUS, max_vus=OPEN_VUS
    ),
    "shared": LoadModel("shared", "shared-iterations", vus=SHARED_VUS, iterations=SHARED_ITERATIONS),
}
DURATION_S = 3


def _profile_cpus() -> int:
    """A service profile that leaves k6 two CPUs: its own where the host has three or more, else
    (a 2-CPU host) every CPU, shared with the service, as the local backend does for a big profile."""
    cpus = len(os.sched_getaffinity(0))
    whole = cpus - INSTANCES if cpus > INSTANCES else cpus
    assert len(split_cpus(sorted(os.sched_getaffinity(0)), whole).k6) >= INSTANCES, "needs two CPUs"
    return whole


MATRIX = f"""
[defaults]
preset = "split"
targets = ["aiohttp-h1"]
profiles = ["split"]
counts = [10]
load_models = ["closed", "open", "shared"]
response_models = ["build"]
duration = "{DURATION_S}s"
warmup = "1s"
repeats = 1
start_timeout = "60s"
stop_timeout = "20s"

[profiles.split]
cpus = {_profile_cpus()}.0
memory = "512m"

[targets.aiohttp-h1]
service = "rest_aiohttp"
script = "k6/rest.js"
protocol = "http1.1"
tls = false
expect_proto = "HTTP/1.1"

[load_models.closed]
executor = "constant-vus"
vus = {CLOSED_VUS}

[load_models.open]
executor = "constant-arrival-rate"
rate = {OPEN_RATE}
pre_allocated_vus = {OPEN_VUS}
max_vus = {OPEN_VUS}

[load_models.shared]
executor = "shared-iterations"
vus = {SHARED_VUS}
iterations = {SHARED_ITERATIONS}

[presets.split]
k6_instances = {INSTANCES}
"""


@pytest.fixture(scope="module")
def split_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("k6-instances")
    matrix = base / "matrix.toml"
    matrix.write_text(MATRIX)
    out = base / "k6-instances-run"  # the run id names its cgroups: unique among the paired phase
    completed = subprocess.run(
        [
            sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
            "--backend", "local", "--matrix", str(matrix),
            "--out", str(out), "--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    results = {
        r["scenario"]["load_model"]["name"]: r
        for r in (json.loads(p.read_text()) for p in (out / "scenarios").glob("*.json"))
    }
    assert sorted(results) == sorted(MODELS), completed.stdout[-4000:]
    return {"out": out, "results": results, "stdout": completed.stdout}


def _samples(out: Path, result: dict[str, Any], index: int) -> np.ndarray:
    path = out / "k6" / f"{result['scenario_id']}.measure.k6-{index}.latency_ms.txt"
    return np.loadtxt(path, ndmin=1)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_instance_ran_its_segment_on_its_own_cpu(split_run: dict[str, Any], model: str) -> None:
    result = split_run["results"][model]
    assert result["status"] == "ok", result["failure"]
    instances = result["k6"]["instances"]
    assert [i["segment"] for i in instances] == ["0:1/2", "1/2:1"]
    k6_cpus = result["service"]["k6_cpus"]
    assert [i["cpus"] for i in instances] == [[cpu] for cpu in k6_cpus[:INSTANCES]]
    assert all(i["exit_code"] == 0 and i["cpu_seconds"] > 0 for i in instances)
    assert result["k6"]["cpus"] == INSTANCES
    assert result["k6"]["cpu_utilisation"] == max(i["cpu_utilisation"] for i in instances)
    # The warm-up was split too, without raw output; the measured raw CSVs were replaced by samples.
    k6_dir = split_run["out"] / "k6"
    prefix = result["scenario_id"]
    assert sorted(p.name for p in k6_dir.glob(f"{prefix}.*")) == sorted(
        f"{prefix}.{phase}.k6-{i}.{kind}"
        for i in (1, 2)
        for phase, kind in (("warmup", "json"), ("measure", "json"), ("measure", "latency_ms.txt"))
    )


@pytest.mark.parametrize("model", sorted(MODELS))
def test_merged_requests_and_errors_are_the_sum_of_the_instances(
    split_run: dict[str, Any], model: str
) -> None:
    k6 = split_run["results"][model]["k6"]
    merged, parts = k6["metrics"], [i["metrics"] for i in k6["instances"]]
    for key in ("requests", "errors", "attempts", "iterations", "data_received_bytes", "checks_passed"):
        assert merged[key] == sum(p[key] for p in parts), key
    assert all(p["requests"] > 0 for p in parts), parts
    # Each instance's own k6 summary agrees with what the runner read.
    for instance in k6["instances"]:
        assert (
            instance["summary_metrics"]["protolab_reqs"]["values"]["count"] == instance["metrics"]["requests"]
        )


@pytest.mark.parametrize("model", sorted(MODELS))
def test_merged_percentiles_are_over_every_instances_samples(split_run: dict[str, Any], model: str) -> None:
    out, result = split_run["out"], split_run["results"][model]
    instances = result["k6"]["instances"]
    samples = [_samples(out, result, i["index"]) for i in instances]
    # The samples are k6's own: one per successful undecoded request (the clock's), and they give
    # back each instance's k6 percentiles (the raw CSV keeps 6 decimals of a millisecond).
    for instance, values in zip(instances, samples, strict=True):
        clock = instance["metrics"]["latency_metric"]
        assert clock == "http_req_duration{decoded:no,expected_response:true}"
        assert len(values) == instance["metrics"]["latency_count"] == instance["latency_samples"]
        assert 0 < len(values) < instance["metrics"]["requests"]  # the decoded ones are not timed
        own = instance["summary_metrics"][clock]["values"]
        for key, q in (("p(50)", 50), ("p(90)", 90), ("p(95)", 95), ("p(99)", 99), ("p(99.9)", 99.9)):
            assert np.percentile(values, q) == pytest.approx(own[key], abs=1e-5), (instance["index"], key)
        assert values.max() == pytest.approx(own["max"], abs=1e-5)
    everything = np.concatenate(samples)
    latency = result["k6"]["metrics"]["latency_ms"]
    for key, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("p99.9", 99.9)):
        assert latency[key] == pytest.approx(float(np.percentile(everything, q)), rel=1e-9), key
    assert latency["avg"] == pytest.approx(float(everything.mean()), rel=1e-9)
    assert latency["max"] == pytest.approx(float(everything.max()), rel=1e-12)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_instance_vus_add_up_to_the_load_model(split_run: dict[str, Any], model: str) -> None:
    result = split_run["results"][model]
    load = MODELS[model]
    vus = [i["metrics"]["vus_max"] for i in result["k6"]["instances"]]
    # k6 gives the first segment the odd VU; an arrival-rate model splits its max_vus.
    assert vus == {"closed": [3, 2], "open": [2, 2], "shared": [2, 1]}[model]
    total = load.max_vus if load.executor == "constant-arrival-rate" else load.vus
    assert sum(vus) == total == result["k6"]["metrics"]["vus_max"]


def test_the_split_load_is_the_load_models(split_run: dict[str, Any]) -> None:
    results = split_run["results"]
    # shared-iterations: the instances shared out exactly the model's iterations.
    shared = results["shared"]["k6"]
    assert shared["metrics"]["iterations"] == SHARED_ITERATIONS
    assert sum(i["metrics"]["iterations"] for i in shared["instances"]) == SHARED_ITERATIONS
    # constant-arrival-rate: each instance started its share of the rate, together the model's rate.
    open_k6 = results["open"]["k6"]
    expected = OPEN_RATE * DURATION_S
    assert open_k6["metrics"]["iterations"] + open_k6["metrics"]["dropped_iterations"] == pytest.approx(
        expected, rel=0.05
    )
    for instance in open_k6["instances"]:
        m = instance["metrics"]
        assert m["iterations"] + m["dropped_iterations"] == pytest.approx(expected / INSTANCES, rel=0.05)
