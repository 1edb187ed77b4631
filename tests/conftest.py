"""Shared fixtures; gRPC runs without fork handlers, as in the runner."""

from collections.abc import Callable, Iterator

import pytest
from labrunner import grpc_fork

# The tests probe gRPC health from threads while forking k6 and services (preexec_fn), as the
# runner does; pytest imports this before any test module imports grpc.
grpc_fork.disable_fork_handlers()

from tests.support import RunningService, launch_service  # noqa: E402  (imports grpc after the setting)


@pytest.fixture
def start_service() -> Iterator[Callable[..., RunningService]]:
    """Start services for one test; every one still running is killed afterwards."""
    started: list[RunningService] = []

    def start(module: str, env: dict[str, str] | None = None) -> RunningService:
        service = launch_service(module, env)
        started.append(service)
        return service

    yield start
    for service in started:
        service.kill()
