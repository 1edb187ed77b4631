"""The local backend starts a service on every CPU and measures it on the service's: once it listens,
every thread of every process in its cgroup is on the service CPUs, under the profile's quota."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from labrunner.backends import cgroups
from labrunner.backends.base import BackendSettings
from labrunner.backends.cgroups import Cgroup, create_cgroup, pin_threads, remove_cgroup, split_cpus, tasks
from labrunner.backends.local import LocalBackend
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario

from services.common.cgroup import cpu_limit_cores
from tests.support import CERTS, ROOT

# A server under the quarter profile's quota, no figure judged.
pytestmark = [pytest.mark.timeout(120), pytest.mark.paired]

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    try:
        made = create_cgroup(f"protolab-test-start-{os.getpid()}", 1.0, 256 << 20)
    except OSError as exc:
        pytest.skip(f"needs a writable cgroup hierarchy (root): {exc}")
    yield made
    remove_cgroup(made)


def _threads_cpus(cgroup: Cgroup) -> dict[int, set[int]]:
    return {
        int(tid): os.sched_getaffinity(int(tid))
        for pid in tasks(cgroup)
        for tid in os.listdir(f"/proc/{pid}/task")
    }


def _grpc_at_a_quarter() -> Scenario:
    overrides = Overrides(targets=("grpc",), load_models=("closed",), repeats=1)
    [scenario] = expand(load_matrix(ROOT / "matrix.toml"), "local", "default", overrides).scenarios
    assert scenario.profile.cpus == 0.25
    return scenario


@pytest.mark.skipif(len(CPUS) < 2, reason="one CPU: the service starts where it is measured")
def test_a_service_that_started_on_every_cpu_is_measured_on_the_service_cpus(tmp_path: Path) -> None:
    settings = BackendSettings("start-test", ROOT, CERTS, tmp_path, Path("k6"), 60.0, 20.0)
    backend = LocalBackend(settings)
    scenario = _grpc_at_a_quarter()
    handle = backend.start_service(scenario)
    try:
        if handle.limits == "affinity":
            pytest.skip("no cgroup here: the service starts pinned")
        service = backend._service(handle)  # the backend's own record: its cgroup
        assert service.cgroup is not None
        threads = _threads_cpus(service.cgroup)
        assert len(threads) > 2  # a supervisor and a worker, the worker's gRPC threads among them
        assert set(map(frozenset, threads.values())) == {frozenset(handle.service_cpus)}
        assert handle.service_cpus == split_cpus(CPUS, 1).service
        assert cpu_limit_cores(service.cgroup.paths) == 0.25
    finally:
        backend.stop_service(handle)
        backend.close()


@contextmanager
def _threads_in(cgroup: Cgroup) -> Iterator[None]:
    """A child in the cgroup with three more threads, on every CPU, until the block ends."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        import threading  # noqa: PLC0415
        import time  # noqa: PLC0415

        os.close(write_end)
        for directory in cgroup.dirs:
            (directory / "cgroup.procs").write_text("0")
        for _ in range(3):
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        os.read(read_end, 1)  # the parent's word
        os._exit(0)
    os.close(read_end)
    try:
        while len(_threads_cpus(cgroup)) < 4:
            os.sched_yield()
        yield
    finally:
        os.write(write_end, b"x")
        os.close(write_end)
        os.waitpid(child, 0)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to move a process between")
def test_pin_threads_moves_every_thread_of_every_process(cgroup: Cgroup) -> None:
    with _threads_in(cgroup):
        assert all(cpus == set(CPUS) for cpus in _threads_cpus(cgroup).values())
        pin_threads(cgroup, CPUS[-1:])
        assert all(cpus == {CPUS[-1]} for cpus in _threads_cpus(cgroup).values())


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to move a process between")
def test_pin_threads_gives_up_on_threads_that_stay_elsewhere(
    cgroup: Cgroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that will not move them (here: a move that does nothing) ends in an error, not a loop."""
    monkeypatch.setattr(cgroups.os, "sched_setaffinity", lambda tid, cpus: None)
    with _threads_in(cgroup), pytest.raises(OSError, match=r"still ran off CPUs \[\d+\]"):
        pin_threads(cgroup, CPUS[-1:])
