"""Real k6 runs of k6/rest.js against an in-test REST server on 127.0.0.1: the summary, every load
model, TLS and HTTP/2 (negotiated or forced off), a wrong record count, a bad load model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.k6_servers import (
    COUNT,
    K6_ABORTED,
    K6_SCRIPT_EXCEPTION,
    K6_THRESHOLDS_FAILED,
    RecordsServer,
    hypercorn_tls,
    k6_options,
    load_summary,
    rest_env,
    run_k6,
    write_h2_app,
)

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]  # answers checked, nothing measured


def test_rest_passes_and_writes_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer() as server:
        result = run_k6("rest.js", rest_env(server), summary=summary)
    assert result.returncode == 0, result.stderr
    assert "protolab: ok_reqs=" in result.stdout and "thresholds=ok" in result.stdout
    metrics = load_summary(summary)
    assert metrics["protolab_reqs"]["values"]["count"] > 0
    assert metrics["protolab_req_failed"]["values"]["rate"] == 0
    assert metrics["checks"]["values"]["rate"] == 1
    assert metrics["checks"]["values"]["passes"] > 0
    durations = metrics["http_req_duration{decoded:no,expected_response:true}"]["values"]
    assert {"avg", "min", "max", "p(50)", "p(90)", "p(95)", "p(99)"} <= durations.keys()
    assert "protolab_req_duration" not in metrics  # latency is k6's own timer only
    assert 0 < durations["p(50)"] <= durations["max"]


LOAD_MODELS = [
    (
        {"LOAD_MODEL": "constant-vus", "VUS": "3", "DURATION": "2s"},
        {"executor": "constant-vus", "vus": 3, "duration": "2s"},
    ),
    (
        {"LOAD_MODEL": "ramping-vus", "STAGES": "1s:3,1s:3,500ms:0"},
        {
            "executor": "ramping-vus",
            "startVUs": 0,
            "stages": [
                {"duration": "1s", "target": 3},
                {"duration": "1s", "target": 3},
                {"duration": "500ms", "target": 0},
            ],
        },
    ),
    (
        {"LOAD_MODEL": "constant-arrival-rate", "RATE": "50", "PRE_ALLOCATED_VUS": "2", "MAX_VUS": "8"},
        {
            "executor": "constant-arrival-rate",
            "rate": 50,
            "timeUnit": "1s",
            "duration": "2s",
            "preAllocatedVUs": 2,
            "maxVUs": 8,
        },
    ),
]


@pytest.mark.parametrize(("env", "scenario"), LOAD_MODELS)
def test_rest_load_models(tmp_path: Path, env: dict[str, str], scenario: dict[str, Any]) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer() as server:
        full_env = rest_env(server, **env)
        result = run_k6("rest.js", full_env, summary=summary)
    options = k6_options("rest.js", {"DURATION": "2s", **full_env})
    assert scenario.items() <= options["scenarios"]["main"].items()
    assert result.returncode == 0, result.stderr
    assert load_summary(summary)["protolab_reqs"]["values"]["count"] > 0


def test_rest_over_tls_trusts_ca_via_ssl_cert_file(tls_material: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_material
    with RecordsServer(tls=(cert, key)) as server:
        result = run_k6("rest.js", rest_env(server, TLS="1", SSL_CERT_FILE=str(ca)))
    assert result.returncode == 0, result.stderr


def test_rest_aborts_when_http2_is_expected_but_not_negotiated(tls_material: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_material
    with RecordsServer(tls=(cert, key)) as server:
        result = run_k6("rest.js", rest_env(server, TLS="1", SSL_CERT_FILE=str(ca), EXPECT_PROTO="HTTP/2.0"))
    assert result.returncode == K6_ABORTED, result.stderr
    assert "server negotiated HTTP/1.1 but EXPECT_PROTO=HTTP/2.0" in result.stderr


@pytest.fixture(scope="module")
def h2_server(
    tmp_path_factory: pytest.TempPathFactory, tls_material: tuple[Path, Path, Path]
) -> Iterator[str]:
    """Hypercorn over TLS offering h2 and http/1.1 via ALPN; yields its https base URL."""
    app_dir = tmp_path_factory.mktemp("h2app")
    # Hypercorn ends a connection after 1,000 requests by default (GOAWAY), which k6 reports
    # as a failed request: the lab's Quart service lifts the limit the same way.
    (app_dir / "hypercorn.toml").write_text("keep_alive_max_requests = 1_000_000_000\n")
    with hypercorn_tls(app_dir, write_h2_app(app_dir), tls_material, "--config", "hypercorn.toml") as port:
        yield f"https://127.0.0.1:{port}"


@pytest.mark.parametrize(("expect", "extra"), [("HTTP/2.0", {}), ("HTTP/1.1", {"GODEBUG": "http2client=0"})])
def test_rest_negotiates_http2_unless_the_runner_forces_http1(
    h2_server: str, tls_material: tuple[Path, Path, Path], expect: str, extra: dict[str, str]
) -> None:
    env = {"BASE_URL": h2_server, "COUNT": str(COUNT), "TLS": "1", "SSL_CERT_FILE": str(tls_material[0])}
    result = run_k6("rest.js", {**env, "EXPECT_PROTO": expect, "CHECK_EVERY": "5", **extra})
    assert result.returncode == 0, result.stderr


def test_rest_wrong_record_count_fails_thresholds(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer(short=1) as server:
        result = run_k6("rest.js", rest_env(server), summary=summary)
    assert result.returncode == K6_THRESHOLDS_FAILED, result.stderr
    assert "thresholds=FAILED" in result.stdout
    metrics = load_summary(summary)
    assert metrics["checks"]["values"]["fails"] > 0
    assert metrics["protolab_req_failed"]["values"]["passes"] > 0  # Rate "passes" = failed requests


def test_bad_load_model_is_a_script_error() -> None:
    with RecordsServer() as server:
        result = run_k6("rest.js", rest_env(server, LOAD_MODEL="closed-loop"))
    assert result.returncode == K6_SCRIPT_EXCEPTION
    assert "unknown LOAD_MODEL=closed-loop" in result.stderr
