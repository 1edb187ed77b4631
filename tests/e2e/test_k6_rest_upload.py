"""k6/rest.js's upload mode with real k6 against real lab servers: every iteration POSTs the bytes
of UPLOAD_FILE, the sampled replies' count and checksum are checked, and a refused upload fails the
run's thresholds."""

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from labrunner.run.k6.binary import find_k6
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics import FLUSH_SECONDS
from services.common.records import load_pool
from tests.support import CERTS, ROOT, RunningService, k6_env, rest_h2, tls_env

POOL_SIZE, SEED, MAX_COUNT, COUNT = 2000, 42, 1000, 100
ENV = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), "MAX_COUNT": str(MAX_COUNT)}
K6_THRESHOLDS_FAILED = 99  # k6's exit code when the run completed with a threshold crossed
K6_SCRIPT_EXCEPTION = 107

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]  # answers checked, nothing measured


def _upload_file(directory: Path, count: int) -> Path:
    """The body the runner writes: count pool records as the GET body holds them."""
    path = directory / f"upload-{count}.json"
    path.write_bytes(orjson.dumps({"records": load_pool(POOL_SIZE, SEED)[:count]}))
    return path


def _run_k6(
    service: RunningService, http2: bool, summary: Path, **settings: str
) -> subprocess.CompletedProcess[str]:
    run = {"DURATION": "3s", "VUS": "2", "CHECK_EVERY": "5", "SUMMARY_FILE": str(summary)}
    env = k6_env(service.port, grpc=False, **run, **settings)
    if http2:
        env = rest_h2(env, f"https://localhost:{service.port}", CERTS / "ca.pem")
    script = str(ROOT / "k6" / "rest.js")
    command = [str(find_k6(None)), "run", "--quiet", script]
    return subprocess.run(command, env=env, check=False, capture_output=True, text=True, timeout=90)


def _posts_answered(service: RunningService, status: str) -> float:
    """POST /records requests the server timed with this status, once its workers have written them."""
    deadline = time.monotonic() + 10
    latest = -1.0
    while True:
        time.sleep(2 * FLUSH_SECONDS)
        text = httpx.get(f"http://127.0.0.1:{service.metrics_port}/metrics", trust_env=False).text
        counted = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "http_server_request_duration_seconds"
            for sample in family.samples
            if sample.name.endswith("_count")
            and (sample.labels["http_request_method"], sample.labels["http_route"]) == ("POST", "/records")
            and sample.labels["http_response_status_code"] == status
        )
        if counted == latest or time.monotonic() > deadline:
            return counted
        latest = counted


def _summary(path: Path) -> dict[str, Any]:
    metrics: dict[str, Any] = json.loads(path.read_text())["metrics"]
    return metrics


@pytest.mark.parametrize(("module", "http2"), [("rest_aiohttp", False), ("rest_quart", True)])
def test_every_iteration_posts_the_file_and_the_replies_check(
    start_service, tmp_path: Path, module: str, http2: bool
) -> None:
    service = start_service(module, {**ENV, **(tls_env() if http2 else {})})
    summary = tmp_path / "summary.json"
    result = _run_k6(
        service, http2, summary, UPLOAD_FILE=str(_upload_file(tmp_path, COUNT)), UPLOAD_COUNT=str(COUNT)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = _summary(summary)
    requests = metrics["protolab_reqs"]["values"]["count"]
    assert requests > 0 and metrics["protolab_req_failed"]["values"]["rate"] == 0
    checks = metrics["checks"]["values"]
    assert checks["passes"] > 0 and checks["fails"] == 0
    assert metrics["http_req_duration{decoded:no,expected_response:true}"]["values"]["count"] > 0
    # Every request k6 made was an upload the server accepted: no GET, no refused POST.
    assert _posts_answered(service, "200") == metrics["http_reqs"]["values"]["count"] == requests


def test_a_refused_upload_fails_the_checks_and_thresholds(start_service, tmp_path: Path) -> None:
    service = start_service("rest_aiohttp", {**ENV, "MAX_REQUEST_BYTES": "1000"})  # the upload: a 413
    summary = tmp_path / "summary.json"
    result = _run_k6(service, False, summary, UPLOAD_FILE=str(_upload_file(tmp_path, COUNT)))
    assert result.returncode == K6_THRESHOLDS_FAILED, result.stdout + result.stderr
    metrics = _summary(summary)
    assert metrics["protolab_req_failed"]["values"]["rate"] == 1
    assert metrics["checks"]["values"]["fails"] > 0
    assert _posts_answered(service, "413") == metrics["http_reqs"]["values"]["count"] > 0


def test_an_upload_count_the_file_does_not_hold_is_a_script_error(start_service, tmp_path: Path) -> None:
    service = start_service("rest_aiohttp", ENV)
    upload = str(_upload_file(tmp_path, COUNT))
    result = _run_k6(
        service, False, tmp_path / "summary.json", UPLOAD_FILE=upload, UPLOAD_COUNT=str(COUNT + 1)
    )
    assert result.returncode == K6_SCRIPT_EXCEPTION, result.stdout + result.stderr
    assert f"holds {COUNT} records, UPLOAD_COUNT={COUNT + 1}" in result.stderr
