"""Shared fixtures; gRPC runs without fork handlers, as in the runner; the docker tests only on request;
the four phases of scripts/test.sh (`--phase parallel`, `--phase docker`, `--phase paired`, `--phase
serial`: docs/testing.md)."""

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
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

from tests.support import (  # noqa: E402  (imports grpc after the setting)
    RunningService,
    launch_service,
    service_metrics_root,
)


def pytest_unconfigure() -> None:
    """Every service has stopped: remove their metrics directories, those of killed ones included."""
    if (root := service_metrics_root()) is not None:
        shutil.rmtree(root, ignore_errors=True)


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


# scripts/test.sh runs the suite in phases. `--phase parallel` (on pytest-xdist's workers) takes
# the tests that only use sockets on ephemeral ports, their own files and processes; `--phase serial`
# (one test at a time) the rest: the tests that measure CPU, set cgroup quotas, drive k6 load or need
# Docker, which a test beside them would disturb. By directory: tests/unit/ is parallel; anywhere else
# (tests/integration/, tests/e2e/) a test is serial unless its module (or class, or itself) is marked
# `parallel` or `paired` (below), so a new load test can only be slower than need be, never measured
# beside another: the e2e modules marked so check what k6 and the servers answer, not what anything
# costs. `serial` (and `docker`) wins over `parallel`: a parallel module marks its few load tests so.
# `--phase docker` takes the `docker` tests out of the serial phase: scripts/test.sh runs them one at a
# time beside the parallel phase. They judge what the runner and the engine did (statuses, containers,
# limits, files), never a figure, and mostly wait on the engine, whose containers run on its CPUs.
# `--phase paired` takes the modules marked `paired` out of it too: they drive load or hold servers
# under CPU quotas, so they stay away from the parallel phase's many tests, but judge only what the code
# decided (statuses, files, refusals, what was left behind), never a figure or a deadline, so two of
# them run at a time, after the parallel phase and before the serial one. `serial` wins over `paired`.
PARALLEL_DIRECTORIES = ("unit",)
PHASES = ("parallel", "docker", "paired", "serial")
_PHASE_NOTE = pytest.StashKey[str]()

# The `docker` tests (tests/e2e/test_docker_*.py) need a Docker engine and the lab's images: they run
# only when asked for, as CI does (.ci/run). Deselected, not skipped: without the variable they are
# not part of the run; with it, a missing engine fails them.
DOCKER_TESTS_VARIABLE = "PROTOLAB_DOCKER_TESTS"
_DOCKER_NOTE = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default=None,
        help="run only the tests of one phase of scripts/test.sh: parallel (safe beside each other, "
        "for pytest-xdist), docker (the Docker engine's, one at a time beside the parallel phase), "
        "paired (load that judges no figure, three at a time) or serial (one at a time, alone: "
        "tests/conftest.py says which); default: every test",
    )


def is_under(item: pytest.Item, directories: tuple[str, ...]) -> bool:
    tests = Path(__file__).parent
    return any(item.path.is_relative_to(tests / directory) for directory in directories)


def is_serial(item: pytest.Item) -> bool:
    """Whether the test must run alone (the rule above)."""
    if item.get_closest_marker("serial") or item.get_closest_marker("docker"):
        return True
    if is_under(item, PARALLEL_DIRECTORIES) or item.get_closest_marker("paired"):
        return False
    return item.get_closest_marker("parallel") is None


def phase_of(item: pytest.Item) -> str:
    """The phase of scripts/test.sh the test runs in."""
    if item.get_closest_marker("docker"):
        return "docker"
    if is_serial(item):
        return "serial"
    return "paired" if item.get_closest_marker("paired") else "parallel"


def _deselect(config: pytest.Config, items: list[pytest.Item], keep: Callable[[pytest.Item], bool]) -> int:
    dropped = [item for item in items if not keep(item)]
    if dropped:
        items[:] = [item for item in items if keep(item)]
        config.hook.pytest_deselected(items=dropped)
    return len(dropped)


@pytest.hookimpl(tryfirst=True)  # before `-m`, so `-m serial` selects the tests serial by directory too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_serial(item) and not item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.serial)
    if os.environ.get(DOCKER_TESTS_VARIABLE) != "1":
        docker = _deselect(config, items, lambda item: not item.get_closest_marker("docker"))
        if docker:
            config.stash[_DOCKER_NOTE] = (
                f"{docker} docker test(s) deselected: they need a Docker engine; run them with "
                f"{DOCKER_TESTS_VARIABLE}=1 (tests/docker/README.md)"
            )
    phase = config.getoption("--phase")
    if phase is not None:
        other = _deselect(config, items, lambda item: phase_of(item) == phase)
        if phase == "parallel":
            # The modules that start servers first, the unit tests' many short ones last: xdist hands
            # out files in this order, so the long ones (a pip install, the fuzzing) do not start at
            # the end while the other workers idle.
            items.sort(key=lambda item: is_under(item, PARALLEL_DIRECTORIES))
        config.stash[_PHASE_NOTE] = (
            f"phase {phase}: {len(items)} test(s), {other} of the other phases deselected"
        )


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return [note for key in (_DOCKER_NOTE, _PHASE_NOTE) if (note := config.stash.get(key, None))]
