"""Serve the Quart app with hypercorn.run.run and Hypercorn's own workers, under the lab's start/stop rules.

Start: this process opens the listening socket (so PORT=0 resolves once, and connections
queue from the first moment), hands it to Hypercorn as fd://, serves /metrics, and prints
the listening line once every spawned worker has created its ready file.

Stop: Hypercorn's SIGTERM handler sets a multiprocessing event that each worker polls every
0.1 s; a worker then stops accepting at once and finishes in-flight requests within
graceful_timeout. Hypercorn has no hook between the signal and the stop, so the drain runs
before Hypercorn sees the signal: SIGTERM and SIGINT are blocked in every thread here and
taken by one thread with sigwait, which creates the drain flag (workers answer /healthz
with 503), waits SHUTDOWN_DRAIN_SECONDS, then calls the handler Hypercorn installed.
hypercorn.run.run returns as soon as its first worker exits, having sent SIGTERM to the
others; workers ignore SIGTERM (see app.py), and this process waits for them instead.
"""

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import threading
import time
from multiprocessing import resource_tracker
from pathlib import Path

from hypercorn.config import Config
from hypercorn.run import run

from services.common.cgroup import worker_count
from services.common.config import Settings, load_settings
from services.common.environment import ConfigError
from services.common.hypercorn_limits import MAX_REQUESTS_PER_CONNECTION
from services.common.metrics import start_metrics_server
from services.common.records import load_pool
from services.common.rest import KEEP_ALIVE_TIMEOUT_SECONDS, LISTEN_BACKLOG
from services.common.supervisor import print_listening
from services.common.tls import count_handshakes
from services.rest_quart import DRAIN_FLAG, READY_PREFIX, runtime_dir

SERVICE = "rest_quart"
APPLICATION = "services.rest_quart.app:create_app()"  # Hypercorn evaluates the call in each worker
CONFIG_FILE = Path(__file__).with_name("hypercorn.toml")
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}

log = logging.getLogger("protolab.rest_quart")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Hypercorn sets on sockets it binds
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


def _listen_quic(host: str, port: int) -> socket.socket:
    """The UDP socket HTTP/3 is served on: the TCP listener's port number, as Alt-Svc advertises it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, port))
    return sock


class HandshakeCountingConfig(Config):
    """Hypercorn's configuration, its TLS context counting the handshakes (services.common.tls).

    Hypercorn makes the context in each worker, from the configuration it pickled for the worker
    (this class, by reference), after the app's startup: its own context, Hypercorn's settings
    unchanged, with the counting SSLObject. The app writes the counts (create_app).
    """

    def create_ssl_context(self) -> ssl.SSLContext | None:
        context = super().create_ssl_context()
        return None if context is None else count_handshakes(context)


def hypercorn_config(settings: Settings, workers: int, fd: int, quic_fd: int | None = None) -> Config:
    """hypercorn.toml, then what the environment decides; handshakes counted when TLS and metrics are on
    (QUIC's handshakes are aioquic's own TLS 1.3, not counted). quic_fd: the UDP socket of HTTP/3."""
    counting = settings.tls and settings.metrics_enabled
    config = (HandshakeCountingConfig if counting else Config).from_toml(CONFIG_FILE)
    config.application_path = APPLICATION
    config.bind = [f"fd://{fd}"]
    if quic_fd is not None:
        config.quic_bind = [f"fd://{quic_fd}"]
    config.workers = workers
    config.backlog = LISTEN_BACKLOG
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_SECONDS
    config.keep_alive_max_requests = MAX_REQUESTS_PER_CONNECTION
    config.graceful_timeout = settings.shutdown_grace_seconds
    config.alpn_protocols = list(settings.alpn_protocols)
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        config.certfile = str(settings.tls_cert_file)
        config.keyfile = str(settings.tls_key_file)
    return config


def _ready_pids() -> list[int]:
    return [int(path.name.removeprefix(READY_PREFIX)) for path in runtime_dir().glob(f"{READY_PREFIX}*")]


def _announce_when_ready(
    settings: Settings, port: int, metrics_port: int, workers: int, ready: threading.Event
) -> None:
    while len(_ready_pids()) < workers:
        time.sleep(0.01)
    print_listening(SERVICE, port, metrics_port, workers, settings)
    ready.set()


def _stop_on_signal(settings: Settings, ready: threading.Event, killed: threading.Event) -> None:
    """Drain, then let Hypercorn stop; a second signal, or the end of the grace period, kills the workers."""
    signal.sigwait(_STOP_SIGNALS)
    ready.wait()  # Hypercorn installs its handler right after starting the workers, before any is ready
    log.info("stopping: draining %.1f s, grace %.1f s", settings.shutdown_drain_seconds,
             settings.shutdown_grace_seconds)  # fmt: skip
    (runtime_dir() / DRAIN_FLAG).touch()
    second = signal.sigtimedwait(_STOP_SIGNALS, settings.shutdown_drain_seconds)
    hypercorn_shutdown = signal.getsignal(signal.SIGTERM)
    if callable(hypercorn_shutdown):
        hypercorn_shutdown(signal.SIGTERM, None)
    # Hypercorn's graceful_timeout does not bound its workers' stop: under uvloop, closing the
    # server waits for every connection to close first, so a client that never reads its
    # response would hold a worker forever. The grace period is enforced here instead.
    if second is None:
        second = signal.sigtimedwait(_STOP_SIGNALS, settings.shutdown_grace_seconds + 1)
    log.warning("second stop signal: killing workers now" if second else "grace period over: killing workers")
    killed.set()
    for pid in _ready_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_for_workers(settings: Settings) -> bool:
    """Wait for the workers Hypercorn left running, up to the grace period; True if all exited 0."""
    deadline = time.monotonic() + settings.shutdown_grace_seconds + 1
    clean = True
    for worker in multiprocessing.active_children():
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.exitcode is None:
            log.warning("grace period over: killing worker %s", worker.pid)
            worker.kill()
            worker.join()
        clean = clean and worker.exitcode == 0
    return clean


def main() -> int:
    """Start Hypercorn's workers, print the listening line, serve until stopped; the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings("rest_quart")
    workers = settings.workers or worker_count()
    if settings.record_mode == "pool":
        # Fills the pool cache once: the spawned workers then load it instead of each running Faker.
        load_pool(settings.record_pool_size, settings.record_seed)
    if settings.http3 and workers > 1:
        # Hypercorn hands every worker the one UDP socket it was given, so a QUIC connection's
        # packets would be read by whichever worker is first, not by the one holding its state.
        raise ConfigError(
            f"HTTP3=1 serves with 1 worker, not {workers}: Hypercorn's workers would share one UDP socket"
        )
    sock = _listen(settings.host, settings.port)
    port = sock.getsockname()[1]
    quic_fd = _listen_quic(settings.host, port).detach() if settings.http3 else None
    config = hypercorn_config(settings, workers, sock.detach(), quic_fd)

    # multiprocessing unblocks SIGINT and SIGTERM after starting its resource tracker (which
    # Hypercorn's shutdown event needs), so it starts first; the mask is set before any thread
    # starts, so all threads inherit it and only _stop_on_signal takes the signals.
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    metrics_port = start_metrics_server(settings.host, settings.metrics_port, SERVICE, "hypercorn", workers)
    ready = threading.Event()
    killed = threading.Event()
    announce = (settings, port, metrics_port, workers, ready)
    threading.Thread(target=_announce_when_ready, args=announce, daemon=True).start()
    threading.Thread(target=_stop_on_signal, args=(settings, ready, killed), daemon=True).start()

    exit_code = run(config)
    clean = _wait_for_workers(settings)
    # hypercorn.run.run reports 0 once every worker is gone, even killed ones: a kill is no clean stop.
    return 0 if exit_code == 0 and clean and not killed.is_set() else 1
