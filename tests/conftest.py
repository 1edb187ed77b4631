"""Shared fixtures; gRPC runs without fork handlers, as in the runner; the docker tests only on request."""

import os
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from labrunner import grpc_fork

if TYPE_CHECKING:
    from tests.docker_fake import FakeDocker

# The tests probe gRPC health from threads while forking k6 and services (preexec_fn), as the
# runner does; pytest imports this before any test module imports grpc.
grpc_fork.disable_fork_handlers()

# The Ctrl-C tests send SIGINT to runners started from here. A shell without job control that
# started the suite in the background left SIGINT ignored, and an ignored signal stays ignored
# across exec, so those runners would never see it; a handled one is reset to the default.
signal.signal(signal.SIGINT, signal.default_int_handler)

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


@pytest.fixture
def fake() -> "FakeDocker":
    """A fresh fake Docker engine (tests/docker_fake.py) for the docker backend's tests; a module that
    needs another one defines its own `fake`."""
    from tests.docker_fake import FakeDocker  # noqa: PLC0415  (the docker SDK only where it is used)

    return FakeDocker()


@pytest.fixture
def docker_quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The docker backend's polls without delay, no CPU calibration, and compose's variables at their
    defaults; a module takes it for every test with
    `pytestmark = pytest.mark.usefixtures("docker_quick_polls")`."""
    from tests.docker_fake import quick_polls_and_compose_defaults  # noqa: PLC0415

    quick_polls_and_compose_defaults(monkeypatch)


# The `docker` tests (tests/e2e/test_docker_*.py) need a Docker engine and the lab's images: they run
# only when asked for, as CI does (.ci/run). Deselected, not skipped: without the variable they are
# not part of the run; with it, a missing engine fails them.
DOCKER_TESTS_VARIABLE = "PROTOLAB_DOCKER_TESTS"
_DOCKER_NOTE = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(DOCKER_TESTS_VARIABLE) == "1":
        return
    docker = [item for item in items if item.get_closest_marker("docker")]
    if not docker:
        return
    items[:] = [item for item in items if not item.get_closest_marker("docker")]
    config.hook.pytest_deselected(items=docker)
    config.stash[_DOCKER_NOTE] = (
        f"{len(docker)} docker test(s) deselected: they need a Docker engine; run them with "
        f"{DOCKER_TESTS_VARIABLE}=1 (tests/docker/README.md)"
    )


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    return config.stash.get(_DOCKER_NOTE, None)
