"""The runner's check before measuring (run/service_checks.verify) for every record shape, over real
sockets: a lab server serving the scenario's shape passes it, downloads (its bytes decode into the
pool's records: canonical checksum) and uploads (the shape's checksum) alike; a server of the same
shape from another pool's seed fails it, naming both checksums."""

from pathlib import Path

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import DEFAULT_DIRECTION, SHAPES, UPLOAD, Overrides, Scenario
from labrunner.run.service_checks import verify
from labrunner.run.uploads import upload_body

from tests.support import CERTS, ROOT, RunningService, launch_service, service_handle

COUNT = 10
CA_FILE = CERTS / "ca.pem"
# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(180), pytest.mark.parallel]


def _scenario(target: str, shape: str, direction: str = DEFAULT_DIRECTION) -> Scenario:
    overrides = Overrides(
        targets=(target,), counts=(COUNT,), directions=(direction,), shapes=(shape,), repeats=1
    )
    (scenario,) = expand(load_matrix(ROOT / "matrix.toml"), "local", "upload", overrides).scenarios
    assert (scenario.shape, scenario.direction) == (shape, direction)
    return scenario


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("target", ["aiohttp-h1", "grpc"])
def test_a_lab_server_of_the_shape_passes_and_another_pool_fails(
    target: str, shape: str, started: list[RunningService], tmp_path: Path
) -> None:
    download = _scenario(target, shape)
    upload = _scenario(target, shape, UPLOAD)
    env = {**dict(download.target.env), "SHAPE": shape, "RECORD_POOL_SIZE": "10000"}
    right = launch_service(download.target.service, env)
    started.append(right)
    verification = verify(service_handle(download, right), download, CA_FILE)
    assert verification.ok, verification.failures
    calls = ("ListRecords", "StreamRecords") if download.target.is_grpc else ("REST /records",)
    for call in calls:
        assert any(
            check.startswith(f"{call}: the pool's records (canonical checksum")
            for check in verification.checks
        )
    body = upload_body(tmp_path, upload)
    assert body is not None and body.shape == shape
    verification = verify(service_handle(upload, right), upload, CA_FILE, body)
    assert verification.ok, verification.failures

    other = launch_service(download.target.service, {**env, "RECORD_SEED": "43"})
    started.append(other)
    verification = verify(service_handle(download, other), download, CA_FILE)
    assert not verification.ok
    for call in calls:
        assert any(
            f"{call}: records differ from the pool's (canonical checksum" in f for f in verification.failures
        )
