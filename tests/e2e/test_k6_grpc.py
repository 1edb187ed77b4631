"""Real k6 runs of k6/grpc_unary.js and grpc_stream.js against a minimal in-test RecordService on
127.0.0.1: they pass, a wrong record count fails the thresholds, TLS trusts the CA given.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.e2e.k6_servers import K6_THRESHOLDS_FAILED, GrpcServer, grpc_env, load_summary, run_k6

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]  # answers checked, nothing measured


@pytest.mark.parametrize("script", ["grpc_unary.js", "grpc_stream.js"])
def test_grpc_passes(tmp_path: Path, pb: tuple[ModuleType, ModuleType], script: str) -> None:
    summary = tmp_path / "summary.json"
    with GrpcServer(pb) as server:
        result = run_k6(script, grpc_env(server), summary=summary)
    assert result.returncode == 0, result.stderr
    metrics = load_summary(summary)
    assert metrics["protolab_reqs"]["values"]["count"] > 0
    assert metrics["checks"]["values"]["rate"] == 1 and metrics["checks"]["values"]["passes"] > 0
    assert metrics["grpc_req_duration{decoded:no}"]["values"]["p(50)"] > 0


@pytest.mark.parametrize("script", ["grpc_unary.js", "grpc_stream.js"])
def test_grpc_wrong_record_count_fails_thresholds(pb: tuple[ModuleType, ModuleType], script: str) -> None:
    with GrpcServer(pb, short=1) as server:
        result = run_k6(script, grpc_env(server))
    assert result.returncode == K6_THRESHOLDS_FAILED, result.stderr


def test_grpc_over_tls_trusts_ca_via_ssl_cert_file(
    pb: tuple[ModuleType, ModuleType], tls_material: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_material
    with GrpcServer(pb, tls=(cert, key)) as server:
        result = run_k6("grpc_unary.js", grpc_env(server, TLS="1", SSL_CERT_FILE=str(ca)))
    assert result.returncode == 0, result.stderr
