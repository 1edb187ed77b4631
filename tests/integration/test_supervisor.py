"""The supervisor's process lifecycle: workers never outlive it."""

import os
import signal
import time

import pytest

from tests.support import child_pids, process_alive

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("module", ["rest_aiohttp", "grpc_aio"])
def test_workers_exit_when_the_supervisor_is_killed(start_service, module: str) -> None:
    service = start_service(module, {"WORKERS": "2"})
    workers = child_pids(service.process.pid)
    assert len(workers) == 2
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait()
    deadline = time.monotonic() + 15
    while any(process_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(w) for w in workers), "workers outlived their supervisor"
