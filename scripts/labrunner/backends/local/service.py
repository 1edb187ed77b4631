"""The service's process on the local backend: spawned in its cgroup and on its CPUs (in its
namespace on a network scenario), its stdout copied to its log until the listening line, and
stopped: SIGTERM, a grace period, then SIGKILL of its whole session."""

import contextlib
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from labrunner.backends.base import (
    BackendSettings,
    ScenarioFailed,
    check_listening,
    listening_event,
    service_env,
    tail_file,
)
from labrunner.backends.cgroups import Cgroup, enter_limits
from labrunner.backends.local.network import HOST, Network
from labrunner.backends.local.usage import Window
from labrunner.model.scenario import Scenario
from labrunner.network.namespaces import exec_prefix

# Service settings the runner decides; inherited values would make runs irreproducible.
SERVICE_KNOBS = frozenset(
    {
        "HOST",
        "PORT",
        "METRICS_PORT",
        "WORKERS",
        "TLS_CERT_FILE",
        "TLS_KEY_FILE",
        "ALPN_PROTOCOLS",
        "RECORD_POOL_SIZE",
        "RECORD_SEED",
        "RECORD_MODE",
        "DEFAULT_COUNT",
        "MAX_COUNT",
        "MAX_REQUEST_BYTES",
        "METRICS_ENABLED",
        "SHUTDOWN_DRAIN_SECONDS",
        "SHUTDOWN_GRACE_SECONDS",
        "GRPC_MAX_CONCURRENT_RPCS",
        "PROMETHEUS_MULTIPROC_DIR",
        "RESPONSE_MODEL",
    }
)
_POLL_S = 0.01  # how often the listening line is looked for


@dataclass
class Service:
    """Mutable state of one running service, private to the backend."""

    scenario: Scenario
    process: subprocess.Popen[bytes]
    cgroup: Cgroup | None
    service_cpus: tuple[int, ...]
    log_file: Path
    reader: threading.Thread
    # prometheus_client's multiprocess files, in a directory of the runner's: removed once the service
    # has stopped, even when it was killed at the end of its grace; a killed runner's, by its resume.
    metrics_dir: Path
    listening: dict[str, Any] = field(default_factory=dict)
    window: Window | None = None
    network: Network | None = None


def spawn(
    settings: BackendSettings,
    scenario: Scenario,
    cgroup: Cgroup | None,
    cpus: tuple[int, ...],
    log_file: Path,
    *,
    network: Network | None = None,
    start_cpus: tuple[int, ...] | None = None,
) -> Service:
    """The service's process, started on start_cpus (default: cpus, the CPUs it is measured on); a
    thread copies its stdout to its log."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # `ip netns exec` execs the service in place: the pid, cgroup and CPUs set here stay.
    prefix = exec_prefix(network.link.service.namespace) if network else []
    host = network.link.service.address if network else HOST
    metrics_dir = _metrics_dir(settings.run_id, scenario.id)
    try:
        with log_file.open("ab") as log:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", scenario.target.main_module],
                cwd=settings.root,
                env=process_env(settings, scenario, host) | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
                stdout=subprocess.PIPE,
                stderr=log,
                # Own session: Ctrl-C reaches the runner only, which then stops the service
                # the same way every time (SIGTERM, grace, SIGKILL).
                start_new_session=True,
                preexec_fn=functools.partial(enter_limits, cgroup, start_cpus or cpus),  # noqa: PLW1509
            )
    except BaseException:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        raise
    assert process.stdout is not None
    service = Service(
        scenario, process, cgroup, cpus, log_file, threading.Thread(), metrics_dir, network=network
    )
    service.reader = threading.Thread(
        target=_pump_stdout, args=(process.stdout, log_file, service), daemon=True
    )
    service.reader.start()
    return service


def _metrics_dir(run_id: str, scenario_id: str) -> Path:
    """A fresh directory for the service's prometheus_client files, after removing those an earlier
    session of the run left for the same scenario: its runner was killed, and the service the kernel
    then stopped (PR_SET_PDEATHSIG) could not know the directory was its own to remove."""
    prefix = f"protolab-metrics-{run_id}-{scenario_id}-"
    for left in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        if left.is_dir() and left.stat().st_uid == os.geteuid():
            shutil.rmtree(left, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix))


def await_listening(scenario: Scenario, service: Service, timeout: float) -> dict[str, Any]:
    """The service's listening line, checked against the scenario; ScenarioFailed in phase "start"."""
    deadline = time.monotonic() + timeout
    while not service.listening and service.reader.is_alive() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    listening = service.listening
    if not listening:
        exited = service.process.poll()
        why = f"exited with code {exited}" if exited is not None else f"no listening line in {timeout:g}s"
        raise ScenarioFailed("start", f"{scenario.target.main_module} {why}", tail_file(service.log_file))
    check_listening(listening, scenario, tail_file(service.log_file))
    return listening


def process_env(settings: BackendSettings, scenario: Scenario, host: str = HOST) -> dict[str, str]:
    """The service's environment: this one's without the knobs the runner sets, then the runner's."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_KNOBS}
    env |= {"HOST": host, "PORT": "0", "METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}
    if scenario.target.tls:
        env["TLS_CERT_FILE"] = str(settings.certs_dir / "server.pem")
        env["TLS_KEY_FILE"] = str(settings.certs_dir / "server-key.pem")
    return env | service_env(scenario)


def _pump_stdout(stdout: IO[bytes], log_file: Path, service: Service) -> None:
    """Copy the service's stdout to its log and catch the listening line; runs until EOF."""
    with log_file.open("ab") as log:
        for line in stdout:
            log.write(line)
            log.flush()
            if not service.listening:
                service.listening = listening_event([line])


def terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the service, SIGKILL its whole session after the grace period.

    The leader is left unreaped (WNOWAIT) until the session is killed, so its pid, which
    is also the process group id, cannot be reused by an unrelated process meanwhile.
    """
    pid = process.pid
    if process.returncode is None and not _exited(pid):
        # os.kill, not send_signal: send_signal reaps a leader that already exited (a crashed
        # service), and waitid would then fail on a pid that is no longer ours.
        with _pidfd(pid) as exited:
            os.kill(pid, signal.SIGTERM)
            # Readable once the leader exits: no polling interval added to every stop.
            select.select([exited], [], [], grace_s)
    with contextlib.suppress(ProcessLookupError):  # workers left behind, or a stuck leader
        os.killpg(pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _exited(pid: int) -> bool:
    """Whether the child has exited, leaving it unreaped."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
