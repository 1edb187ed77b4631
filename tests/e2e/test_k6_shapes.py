"""Real k6 against real lab servers serving each record shape beside cars (SHAPE on both sides): the
three scripts download the shape's records and check every decoded one, and upload the runner's file
of them with the reply's count and checksum checked (k6/lib/common.js computes the shape's checksum
as services/common/shapes.py does). A k6 that asks for another shape than the server serves fails."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from labrunner.run.k6.output import K6Metrics, parse_summary

from services.common.pool import SHAPES, load_pool
from tests.e2e.k6_servers import K6_THRESHOLDS_FAILED, k6_binary
from tests.support import ROOT, RunningService, fixed_calls, k6_env, launch_service, stream_end_lost

POOL_SIZE, SEED, COUNT = 2000, 42, 20
OTHER_SHAPES = [shape for shape in SHAPES if shape != "cars"]
# (script, the lab server it drives)
SCRIPTS = [("rest.js", "rest_aiohttp"), ("grpc_unary.js", "grpc_aio"), ("grpc_stream.js", "grpc_grpclib")]

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(300)]  # answers checked, nothing measured


@pytest.fixture(
    scope="module",
    params=[(shape, script, module) for shape in OTHER_SHAPES for script, module in SCRIPTS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, RunningService]]:
    shape, script, module = request.param
    service = launch_service(
        module, {"SHAPE": shape, "RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED)}
    )
    yield shape, script, service
    assert service.stop() == 0


ITERATIONS = 20


def run_k6(
    script: str, service: RunningService, summary: Path, **settings: str
) -> tuple[subprocess.CompletedProcess[str], K6Metrics]:
    env = k6_env(
        service.port,
        grpc=script != "rest.js",
        **{
            "COUNT": str(COUNT),
            **fixed_calls(ITERATIONS, 2),
            "CHECK_EVERY": "1",  # every reply decoded and checked
            "SUMMARY_FILE": str(summary),
            **settings,
        },
    )
    completed = subprocess.run(
        [k6_binary(), "run", "--quiet", "--no-color", str(ROOT / "k6" / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert summary.is_file(), completed.stdout + completed.stderr[-2000:]
    return completed, parse_summary(orjson.loads(summary.read_bytes()))


def test_k6_downloads_and_uploads_the_shape_with_every_reply_checked(
    served: tuple[str, str, RunningService], tmp_path: Path
) -> None:
    shape, script, service = served
    completed, k6 = run_k6(script, service, tmp_path / "download.json", SHAPE=shape)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    assert k6.requests >= ITERATIONS - stream_end_lost(script) and k6.errors == 0
    assert k6.checks_failed == 0 and k6.checks_passed >= k6.requests * 2  # count and every field (and status)

    upload = tmp_path / "upload.json"
    upload.write_bytes(orjson.dumps({"records": load_pool(POOL_SIZE, SEED, shape)[:COUNT]}))
    completed, k6 = run_k6(
        script,
        service,
        tmp_path / "upload-summary.json",
        SHAPE=shape,
        UPLOAD_FILE=str(upload),
        UPLOAD_COUNT=str(COUNT),
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    assert k6.requests >= ITERATIONS - stream_end_lost(script) and k6.errors == 0
    assert k6.checks_failed == 0 and k6.checks_passed >= k6.requests * 2  # count and checksum (and status)


def test_k6_asking_for_another_shape_fails(served: tuple[str, str, RunningService], tmp_path: Path) -> None:
    shape, script, service = served
    other = "cars" if shape != "cars" else "numeric"
    completed, k6 = run_k6(script, service, tmp_path / "summary.json", SHAPE=other)
    assert completed.returncode == K6_THRESHOLDS_FAILED, completed.stdout + completed.stderr[-2000:]
    assert k6.checks_failed > 0 or k6.errors > 0
