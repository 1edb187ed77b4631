"""Run a service as forked worker processes under a supervisor that serves metrics and signals.

Import this only after services.common.multiprocess.prepare_multiprocess_dir() has run.

Workers share the listening port with SO_REUSEPORT, so the kernel spreads connections
over them; that is the only reason reuse-port is on (a single worker binds plainly, so
a port clash fails loudly). Workers are forked before any gRPC object or event loop
exists (fork after gRPC initialises is unsupported, see grpc/grpc#16001). The record
pool is loaded before the fork and shared copy-on-write.

Shutdown: SIGTERM or SIGINT to the supervisor is forwarded as SIGTERM to every worker,
which reports not-serving on health, keeps serving for the drain time, stops accepting
and finishes in-flight requests within the grace period, then exits 0. A second signal,
or the end of the grace period, kills the workers at once.
"""

import contextlib
import ctypes
import functools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import ForkProcess
from types import FrameType

from services.common import heap, interpreter
from services.common.cgroup import worker_count
from services.common.config import Settings
from services.common.environment import ConfigError
from services.common.metrics import start_metrics_server
from services.common.records import RecordSource, ensure_pool_cached, load_pool
from services.common.shapes import shape_kit

log = logging.getLogger("protolab.supervisor")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_STARTUP_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class WorkerContext:
    """What a worker needs: its settings, records, the port and whether to share it."""

    settings: Settings
    port: int
    reuse_port: bool
    index: int
    report_listening: Callable[[int], None]  # call with the bound port once accepting

    @functools.cached_property
    def records(self) -> RecordSource:
        """The worker's records, loaded in the worker after the fork. A pool the supervisor loaded
        before forking cost an aiohttp worker 13% more CPU per request, whatever the worker did with
        it (measured: docs/results.md, "The lab against its floor")."""
        return record_source(self.settings)


WorkerMain = Callable[[WorkerContext], None]


def _report_port(
    listening: "multiprocessing.SimpleQueue[tuple[int, int]]", index: int, gc_freeze: bool, port: int
) -> None:
    """A worker's report_listening, once it accepts: its start-up heap frozen (heap.freeze_startup), then
    its index and bound port to the supervisor."""
    heap.freeze_startup(gc_freeze)
    listening.put((index, port))


def record_source(settings: Settings) -> RecordSource:
    """The records a worker serves: the pool of its shape (loaded or generated once) in the shape's
    neutral form, or live Faker records (cars only)."""
    live = settings.record_mode == "live"
    pool = [] if live else load_pool(settings.record_pool_size, settings.record_seed, settings.shape)
    from_json = shape_kit(settings.shape).from_json
    return RecordSource(
        pool=[from_json(record) for record in pool],
        max_count=settings.max_count,
        default_count=settings.default_count,
        live=live,
    )


def _reserve_shared_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) so port 0 resolves once for all workers; it takes no connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def listen_socket(context: WorkerContext, backlog: int) -> socket.socket:
    """The worker's listening socket, for servers that are handed a socket rather than binding one
    (Granian, grpclib): SO_REUSEPORT only when the workers share the port, as for the servers that
    bind themselves, so a single worker still fails loudly on a busy port."""
    family = socket.AF_INET6 if ":" in context.settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if context.reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted connections inherit it
    sock.bind((context.settings.host, context.port))
    sock.listen(backlog)
    return sock


def _worker_entry(worker_main: WorkerMain, context: WorkerContext, supervisor_pid: int) -> None:
    # Ctrl-C reaches the whole process group; only the supervisor's SIGTERM stops a worker,
    # so one key press is one graceful shutdown, not two signals and a kill.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A supervisor killed outright (SIGKILL, OOM) cannot forward SIGTERM: have the kernel do it,
    # so no worker outlives it holding the port.
    if not signal_when_parent_dies(signal.SIGTERM, supervisor_pid):
        return
    worker_main(context)


def signal_when_parent_dies(signum: int, parent_pid: int) -> bool:
    """Have the kernel send signum to this process when its parent exits; False if it already has."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    return os.getppid() == parent_pid  # checked after prctl, so no death goes unnoticed


def run_service(
    service: str, server: str, settings: Settings, worker_main: WorkerMain, *, serve_metrics: bool = True
) -> int:
    """Start the workers, print the listening line, supervise until shutdown; the exit code.

    serve_metrics=False (the floor servers, benchmarks/floor/) serves no /metrics: metrics_port 0.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    workers = settings.workers or worker_count()
    if (
        settings.record_mode == "pool"
    ):  # once, so that the workers load the pool instead of each running Faker
        ensure_pool_cached(settings.record_pool_size, settings.record_seed, settings.shape)
    reuse_port = workers > 1
    reservation = _reserve_shared_port(settings.host, settings.port) if reuse_port else None
    port = reservation.getsockname()[1] if reservation else settings.port

    fork = multiprocessing.get_context("fork")
    listening: multiprocessing.SimpleQueue[tuple[int, int]] = fork.SimpleQueue()
    processes = []
    for index in range(workers):
        serving = functools.partial(_report_port, listening, index, settings.gc_freeze)
        context = WorkerContext(settings, port, reuse_port, index, serving)
        process = fork.Process(
            target=_worker_entry, args=(worker_main, context, os.getpid()), name=f"{service}-{index}"
        )
        process.start()
        processes.append(process)

    stop_requests: list[int] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop_requests.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    bound_ports = _await_listening(listening, processes)
    if reservation:
        reservation.close()
    if bound_ports is None:
        _kill(processes)
        return 1
    metrics_port = 0
    if serve_metrics:
        metrics_port = start_metrics_server(settings.host, settings.metrics_port, service, server, workers)
    print_listening(service, bound_ports.pop(), metrics_port, workers, settings)
    return _supervise(processes, settings, stop_requests)


def print_listening(service: str, port: int, metrics_port: int, workers: int, settings: Settings) -> None:
    """Print the one JSON line (docs/CONTRACTS.md) that tests and the runner read: the bound ports, the
    response model and the record shape the results are recorded under and the Python build that
    serves."""
    event = {
        "event": "listening",
        "service": service,
        "port": port,
        "metrics_port": metrics_port,
        "workers": workers,
        "tls": settings.tls,
        "response_model": settings.response_model.value,
        "shape": settings.shape,
        "compression": settings.compression,
        "http3": settings.http3,
        "interpreter": {**interpreter.describe(), "gc": heap.describe(settings.gc_freeze)},
    }
    print(json.dumps(event), flush=True)


def _await_listening(
    listening: "multiprocessing.SimpleQueue[tuple[int, int]]",
    processes: list[ForkProcess],
) -> set[int] | None:
    """The set of bound ports once every worker listens; None if one died first."""
    ports: dict[int, int] = {}
    deadline = time.monotonic() + _STARTUP_TIMEOUT_SECONDS
    while len(ports) < len(processes):
        if any(p.exitcode is not None for p in processes) or time.monotonic() > deadline:
            log.error("a worker exited or hung before listening; see its error above")
            return None
        if listening.empty():
            time.sleep(0.01)
            continue
        index, port = listening.get()
        ports[index] = port
    return set(ports.values())


def _supervise(processes: list[ForkProcess], settings: Settings, stop_requests: list[int]) -> int:
    """Wait for a stop signal or a worker death; forward the stop; the exit code.

    The supervisor shares its workers' cgroup (and, in a container, their CPU quota): it sleeps until
    something happens, a worker exiting (its sentinel) or a signal (the wake-up pipe), not on a timer
    (what a timer cost: docs/results.md, the harness).
    """
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    os.set_blocking(wakeup_read, False)
    previous_wakeup = signal.set_wakeup_fd(wakeup_write)
    try:
        return _supervise_until_done(processes, settings, stop_requests, wakeup_read)
    finally:
        signal.set_wakeup_fd(previous_wakeup)
        os.close(wakeup_read)
        os.close(wakeup_write)


def _supervise_until_done(
    processes: list[ForkProcess], settings: Settings, stop_requests: list[int], wakeup: int
) -> int:
    deadline: float | None = None
    forwarded = 0
    # The workers not seen to exit, polled once a pass: the same list is the loop's condition and the
    # sentinels waited on. Polled twice (is_alive() reaps), a worker that exited between the two polls
    # was in neither, and the supervisor slept out its deadline, drain + grace + 1 s (issue 37).
    running = list(processes)
    while running:
        if len(stop_requests) > forwarded:
            if forwarded == 0:
                log.info("stopping: draining %.1f s, grace %.1f s", settings.shutdown_drain_seconds,
                         settings.shutdown_grace_seconds)  # fmt: skip
                for process in running:
                    if process.pid:
                        os.kill(process.pid, signal.SIGTERM)
                deadline = (
                    time.monotonic() + settings.shutdown_drain_seconds + settings.shutdown_grace_seconds + 1
                )
            else:
                log.warning("second stop signal: killing workers now")
                _kill(processes)
                return 1
            forwarded = len(stop_requests)
        if deadline is not None and time.monotonic() > deadline:
            log.warning("grace period over: killing workers")
            _kill(processes)
            return 1
        if deadline is None and len(running) < len(processes):
            log.error("a worker died unexpectedly (exit codes %s); stopping", [p.exitcode for p in processes])
            _kill(processes)
            return 1
        if len(stop_requests) > forwarded:
            continue  # a signal arrived since the checks above: handle it before sleeping
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = multiprocessing.connection.wait([wakeup, *(p.sentinel for p in running)], timeout=timeout)
        if wakeup in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup, 512)  # the signals' bytes; their handler has run (request_stop)
        running = [p for p in running if p.is_alive()]
    if deadline is None:  # every worker died before the loop above could see one die alone
        log.error("workers died unexpectedly (exit codes %s)", [p.exitcode for p in processes])
        return 1
    return 0 if all(p.exitcode == 0 for p in processes) else 1


def _kill(processes: list[ForkProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


def main_guard(run: Callable[[], int]) -> None:
    """Exit with run()'s code; configuration errors print one clear line, no traceback."""
    try:
        sys.exit(run())
    except ConfigError as error:
        print(f"configuration error: {error}", file=sys.stderr)
        sys.exit(2)
