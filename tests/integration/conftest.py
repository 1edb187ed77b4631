"""Fixtures the gRPC service tests share (tests/integration/test_grpc_*.py): the server under test,
once per module for each of GRPC_SERVERS, and its plaintext instance; and the services a test starts
itself that must stop cleanly (started).
"""

from collections.abc import Iterator

import pytest

from tests.integration.grpc_support import BASE_ENV
from tests.support import GRPC_SERVERS, RunningService, launch_service


@pytest.fixture(scope="module", params=GRPC_SERVERS)
def module(request: pytest.FixtureRequest) -> str:
    """The gRPC server under test: every test that uses it (or a server started from it) runs on each."""
    return str(request.param)


@pytest.fixture(scope="module")
def plain_service(module: str) -> Iterator[RunningService]:
    """The server under test, plaintext, shared by a module's read-only tests."""
    service = launch_service(module, BASE_ENV)
    yield service
    assert service.stop() == 0


@pytest.fixture
def started() -> Iterator[list[RunningService]]:
    """The services a test appends here, each stopped after it and required to exit 0."""
    services: list[RunningService] = []
    yield services
    assert [service.stop() for service in services] == [0] * len(services)
