"""The supervisor's process lifecycle: workers never outlive it."""

import os
import signal
import time

import pytest

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


def _children(pid: int) -> list[int]:
    tasks = f"/proc/{pid}/task/{pid}/children"
    with open(tasks) as handle:
        return [int(p) for p in handle.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("module", ["rest_aiohttp", "grpc_aio"])
def test_workers_exit_when_the_supervisor_is_killed(start_service, module: str) -> None:
    service = start_service(module, {"WORKERS": "2"})
    workers = _children(service.process.pid)
    assert len(workers) == 2
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait()
    deadline = time.monotonic() + 15
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "workers outlived their supervisor"
