"""Shared fixtures; gRPC runs without fork handlers, as in the runner; the docker tests only on request;
the two phases of scripts/test.sh (`--phase parallel`, `--phase serial`: docs/testing.md)."""

import os
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


# scripts/test.sh runs the suite in two phases. `--phase parallel` (on pytest-xdist's workers, two at
# a time on the lab's 2-vCPU VM) takes the tests whose assertions are what the code decided: servers
# on ephemeral ports, and runs, k6 load and Docker whose outcome a test beside them can slow down but
# not change. `--phase serial` (one test at a time) takes the tests that assert what something costs
# or how it behaves under a time bound (an interference flag, a link's measured RTT, health checks
# during a flood, a drain window), which a test beside them would disturb. By directory: tests/unit/
# is parallel; anywhere else (tests/integration/, tests/e2e/) a test is serial unless its module (or
# class, or itself) is marked `parallel`, so a new load test can only be slower than need be, never
# measured beside another. `serial` wins over `parallel`: a parallel module marks its few measured
# tests so. In the parallel phase a module stays on one worker with its module-scoped fixtures (its
# xdist group, `--dist loadgroup`), and the `docker` tests are one group, run in their files' order
# on one worker (the engine's lab comes up once, in test_docker_compose.py, and goes in
# test_docker_teardown.py), handed out first as the longest.
PARALLEL_DIRECTORIES = ("unit",)
PHASES = ("parallel", "serial")
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
        "for pytest-xdist) or serial (one at a time: tests/conftest.py says which); default: every test",
    )


def is_under(item: pytest.Item, directories: tuple[str, ...]) -> bool:
    tests = Path(__file__).parent
    return any(item.path.is_relative_to(tests / directory) for directory in directories)


def is_serial(item: pytest.Item) -> bool:
    """Whether the test must run alone (the rule above)."""
    if item.get_closest_marker("serial"):
        return True
    if is_under(item, PARALLEL_DIRECTORIES) or item.get_closest_marker("docker"):
        return False
    return item.get_closest_marker("parallel") is None


DOCKER_GROUP = "docker"


def _group(item: pytest.Item) -> None:
    """The xdist group of a parallel-phase test: the docker tests' one, or its module's."""
    if item.get_closest_marker("xdist_group") is None:
        name = DOCKER_GROUP if item.get_closest_marker("docker") else str(item.path)
        item.add_marker(pytest.mark.xdist_group(name))


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
        serial = phase == "serial"
        other = _deselect(config, items, lambda item: is_serial(item) == serial)
        if not serial:
            # The docker tests first, then the modules that start servers, the unit tests' many short
            # ones last: xdist hands out groups in this order, so the long ones (the docker group, a
            # pip install, the fuzzing) do not start at the end while the other worker idles.
            items.sort(
                key=lambda item: (
                    item.get_closest_marker("docker") is None,
                    is_under(item, PARALLEL_DIRECTORIES),
                )
            )
            for item in items:
                _group(item)
        config.stash[_PHASE_NOTE] = (
            f"phase {phase}: {len(items)} test(s), {other} of the other phase deselected"
        )


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return [note for key in (_DOCKER_NOTE, _PHASE_NOTE) if (note := config.stash.get(key, None))]
