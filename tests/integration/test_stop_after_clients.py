"""A stop after the clients have gone (issue 37): the supervisor exits as soon as its workers have.

The supervisor (services/common/supervisor.py) polled its workers twice a pass, once for its loop's
condition and once for the sentinels it then waited on. is_alive() reaps a worker that has exited, so
a worker that exited between the two polls was in neither: the supervisor slept until its deadline
(drain + grace + 1 s) and then exited 0 with nothing logged. A worker's sentinel wakes the supervisor
a few milliseconds before the worker can be reaped, so it polled again and again in that window, and
about one stop in ten, on every server it runs, waited out the whole grace period; most visibly after
k6, whose clients had gone, in the runner and in `docker compose stop`.

Here each server is stopped ROUNDS times, each time right after a client process was killed in the
middle of its requests, with a grace period no stop reaches (GRACE_S): a supervisor that missed its
workers' exit would still be waiting, with no worker left, long after STOP_BOUND_S, which only bounds
a hang (a stop here takes well under a second). Each stop must end on the workers' own exit: exit 0,
nothing killed, no worker left.
"""

import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import GRPC_SERVERS, ROOT, child_pids, launch_service, process_alive

WORKERS = 2
GRACE_S = 600  # the supervisor's deadline is drain + grace + 1 s: far past STOP_BOUND_S
STOP_BOUND_S = 60  # a hang, not a duration: a stop here needs well under a second
ROUNDS = 15  # the race took 6 of 60 such stops: these 30 (15 a server) see it 96 times in 100
ENV = {
    "WORKERS": str(WORKERS),
    "SHUTDOWN_DRAIN_SECONDS": "0",  # as the runner stops its services (SERVICE_STOP_ENV)
    "SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
}
CONNECTIONS = 8
LOADED_AFTER = 200  # responses the client has had before it is killed, with more in flight
LOADED = "loaded"
# What the supervisor logs when it kills its workers or sees one die before a stop.
KILLED = ("grace period over", "second stop signal", "died unexpectedly")
MODULES = ["rest_aiohttp", "grpc_aio"]

# A client process that keeps CONNECTIONS requests in flight until it is killed; it prints LOADED
# once LOADED_AFTER have been answered. argv: the port.
REST_CLIENT = f"""
import asyncio, sys
import aiohttp

async def main(port):
    answered = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit={CONNECTIONS})) as session:
        async def ask():
            nonlocal answered
            while True:
                async with session.get(f"http://127.0.0.1:{{port}}/records?count=100") as response:
                    await response.read()
                answered += 1
                if answered == {LOADED_AFTER}:
                    print("{LOADED}", flush=True)
        await asyncio.gather(*(ask() for _ in range({CONNECTIONS})))

asyncio.run(main(int(sys.argv[1])))
"""
GRPC_CLIENT = f"""
import asyncio, sys
import grpc.aio
from services.common.pb import cars_pb2, cars_pb2_grpc

async def main(port):
    answered = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{{port}}") as channel:
        stub = cars_pb2_grpc.RecordServiceStub(channel)
        async def ask():
            nonlocal answered
            while True:
                await stub.ListRecords(cars_pb2.ListRecordsRequest(count=100))
                answered += 1
                if answered == {LOADED_AFTER}:
                    print("{LOADED}", flush=True)
        await asyncio.gather(*(ask() for _ in range({CONNECTIONS})))

asyncio.run(main(int(sys.argv[1])))
"""

# Client processes and servers on ephemeral ports, judged only on what the supervisor did: two at a
# time, after the parallel phase (tests/conftest.py).
pytestmark = [pytest.mark.timeout(240), pytest.mark.paired]


def kill_client_mid_requests(module: str, port: int) -> None:
    """Run a client process against port until it has had LOADED_AFTER answers, then SIGKILL it."""
    script = GRPC_CLIENT if module in GRPC_SERVERS else REST_CLIENT
    client = subprocess.Popen(
        [sys.executable, "-c", script, str(port)],
        cwd=ROOT,  # with -c the working directory is where imports look first: services.common.pb imports
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    try:
        ready, _, _ = select.select([client.stdout], [], [], 30)
        assert ready, "the client had no answers in 30 s"
        assert client.stdout.readline().strip() == LOADED, f"the client ended (exit {client.poll()})"
    finally:
        client.kill()
        client.wait()


@pytest.mark.parametrize("module", MODULES)
def test_a_stop_after_the_clients_have_gone_ends_when_the_workers_do(module: str, tmp_path: Path) -> None:
    for stop in range(ROUNDS):
        log_path = tmp_path / f"{module}-{stop}.log"
        with log_path.open("w") as log:
            service = launch_service(module, ENV, stderr=log)
            try:
                workers = child_pids(service.process.pid)
                assert len(workers) == WORKERS
                kill_client_mid_requests(module, service.port)
                service.process.send_signal(signal.SIGTERM)
                try:
                    code = service.process.wait(timeout=STOP_BOUND_S)
                except subprocess.TimeoutExpired:
                    left = [worker for worker in workers if process_alive(worker)]
                    pytest.fail(
                        f"stop {stop}: the supervisor still waits for its deadline (grace {GRACE_S} s) "
                        f"with workers {left} alive" + ("" if left else ": it missed their exit")
                    )
            finally:
                service.kill()  # the group, if anything of it is left
        logged = log_path.read_text()
        assert code == 0, f"stop {stop}: exit {code}\n{logged}"
        assert "stopping: draining" in logged, logged
        assert not [line for line in logged.splitlines() if any(k in line for k in KILLED)], logged
        outlived = [worker for worker in workers if process_alive(worker)]
        assert not outlived, f"stop {stop}: workers {outlived} outlived the stop"
