"""Fixtures the end-to-end tests share.

The k6 script tests' (tests/e2e/test_k6_*.py): a lab CA and server certificate, the generated gRPC
stubs, once per module.

The docker tests' (tests/e2e/test_docker_*.py): the engine and the lab, once for the session.
Compose comes up once, as a plain `up` starts it; the standing services (profile "services") come
up by hand in one test and go again, so the runs see only what the runner needs. The files run in
the order of their names: test_docker_compose.py first, test_docker_teardown.py, which takes the
lab down and checks that nothing is left, last.
"""

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.e2e.docker_lab import NOT_STARTED, STANDING, Engine, compose, compose_up, preflight
from tests.e2e.k6_servers import make_tls_material


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA, server certificate, key) for 127.0.0.1 and localhost."""
    return make_tls_material(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def pb() -> tuple[ModuleType, ModuleType]:
    """The project's generated stubs: a second copy would clash in the protobuf descriptor pool."""
    return importlib.import_module("services.common.pb.cars_pb2"), importlib.import_module(
        "services.common.pb.cars_pb2_grpc"
    )


@pytest.fixture(scope="session")
def engine() -> Engine:
    return preflight()


@pytest.fixture(scope="session")
def lab(engine: Engine) -> Iterator[list[str]]:
    """The README's commands: `docker compose --profile services build`, then `up -d --wait` of what
    a plain `up -d` starts, but Grafana."""
    started = [s for s in compose("config", "--services").stdout.split() if s not in NOT_STARTED]
    compose(*STANDING, "down", "-v", "--remove-orphans")  # whatever an earlier session left
    compose(*STANDING, "build", "--quiet", timeout=900)
    compose_up(started)
    yield started
    compose(*STANDING, "down", "-v", "--remove-orphans", check=False)  # a no-op when the last test ran
