"""The local backend: each service a process in its own cgroup, k6 on the CPUs left over.

One module over 500 lines because its parts share one lifecycle: a service's process, cgroup,
network namespace and k6 runs start, are measured and are torn down together (the cgroup and
namespace code that stands alone lives in cgroups.py and network/).
"""

import contextlib
import ctypes
import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from labrunner import interrupts
from labrunner.backends.base import (
    BackendSettings,
    BackendUnavailable,
    Endpoint,
    K6Invocation,
    K6Process,
    ScenarioFailed,
    ServiceHandle,
    ServiceUsage,
    check_listening,
    check_profile_fits,
    delta,
    k6_instances_problem,
    listening_event,
    service_env,
    shared_cpus_note,
    tail_file,
)
from labrunner.backends.cgroups import (
    Cgroup,
    CgroupUnavailable,
    create_cgroup,
    join_cgroup,
    remove_cgroup,
    reset_memory_peak,
    set_cpu_quota,
    split_cpus,
)
from labrunner.model.scenario import K6Instances, Profile, Scenario
from labrunner.network.emulators import Emulator, UserspaceEmulator, choose_emulator
from labrunner.network.link_checks import LinkMeasurement, LinkVerificationError, verify
from labrunner.network.namespaces import (
    NAMESPACE_PREFIX,
    Link,
    NetworkError,
    add_host_access,
    create_link,
    exec_prefix,
    hold,
    plan_link,
    remove_leftovers,
    remove_link,
    require_net_admin,
)
from labrunner.say import Say
from services.common.cgroup import CgroupStats, read_stats

HOST = "127.0.0.1"
# Runs' namespaces: the leftovers a run removes are these, never a test's (protolab-t<pid>-).
RUN_NAMESPACE_PREFIX = f"{NAMESPACE_PREFIX}run-"
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
        "METRICS_ENABLED",
        "SHUTDOWN_DRAIN_SECONDS",
        "SHUTDOWN_GRACE_SECONDS",
        "GRPC_MAX_CONCURRENT_RPCS",
        "PROMETHEUS_MULTIPROC_DIR",
        "RESPONSE_MODEL",
    }
)
K6_INHERITED_ENV = ("PATH", "HOME", "TMPDIR")
_POLL_S = 0.01  # how often the listening line is looked for
_K6_INTERRUPT_GRACE_S = 10.0
_K6_POLL_S = 0.01  # how often split k6 instances are checked for their end
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up once here: a child between fork and exec must not dlopen (see _enter_limits).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def probe() -> str:
    """The local backend runs wherever Python does; how well it limits the service, it says per scenario."""
    return "local processes"


def create(settings: BackendSettings, say: Say) -> "LocalBackend":
    del say  # the local backend reports through each scenario's notes
    return LocalBackend(settings)


@dataclass(frozen=True)
class _Window:
    before: CgroupStats
    after: CgroupStats
    wall_seconds: float
    memory_peak_scope: str


@dataclass
class _Service:
    """Mutable state of one running service, private to the backend."""

    scenario: Scenario
    process: subprocess.Popen[bytes]
    cgroup: Cgroup | None
    service_cpus: tuple[int, ...]
    log_file: Path
    reader: threading.Thread
    listening: dict[str, Any] = field(default_factory=dict)
    window: _Window | None = None
    network: "_Network | None" = None


@dataclass
class _Network:
    """A network scenario's link and the emulator on it, until the scenario ends."""

    link: Link
    held: list[int]  # open namespace files: other runs' remove_leftovers() leave the link alone
    emulator: Emulator | None = None  # set once it is applied, so teardown knows to remove it
    measurement: LinkMeasurement | None = None


class LocalBackend:
    """Services from `python -m services.<name>` (or a target's module), k6 from this host; both bound
    to 127.0.0.1."""

    name = "local"
    cpus_elsewhere = None  # everything runs on this host

    def __init__(self, settings: BackendSettings) -> None:
        self._settings = settings
        # Written by start_service on the main thread and by stop_service on the finisher's.
        self._services: dict[str, _Service] = {}
        self._services_lock = threading.Lock()
        if os.geteuid() == 0:
            # What a killed run left (namespaces, their veths, orphaned services); a live run
            # holds its namespaces open, so they stay.
            with contextlib.suppress(NetworkError):  # no iproute2: network scenarios say so later
                remove_leftovers(RUN_NAMESPACE_PREFIX, keep_in_use=True)

    def check_k6_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        available = sorted(os.sched_getaffinity(0))
        k6_cpus = split_cpus(available, profile.whole_cpus).k6
        where = f"this host has {len(available)} CPUs and profile {profile.name} needs {profile.whole_cpus}"
        if problem := k6_instances_problem(k6_instances, len(k6_cpus), where):
            raise BackendUnavailable(problem)

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        profile = scenario.profile
        available = sorted(os.sched_getaffinity(0))
        check_profile_fits(profile, len(available), f"this host has {len(available)}")
        split = split_cpus(available, profile.whole_cpus)
        notes: list[str] = []
        cgroup = self._cgroup(scenario, notes)
        if split.shared:
            notes.append(shared_cpus_note(split.k6, f"the host has {len(available)} CPUs", profile))
        log_file = self._settings.logs_dir / f"{scenario.id}.service.log"
        network: _Network | None = None
        service: _Service | None = None  # once set, also known to _release
        try:
            if scenario.network.emulated:
                network = self._network(scenario, split.k6, notes)
            with interrupts.held():  # a Ctrl-C inside Popen would leave the child running, unknown
                service = self._spawn(scenario, cgroup, split.service, log_file, network)
                with self._services_lock:
                    self._services[scenario.id] = service
            listening = self._await_listening(scenario, service)
            if cgroup is not None:
                set_cpu_quota(cgroup, profile.cpus)
        except BaseException:
            # No handle reaches the runner, so what was made is removed here.
            if service is not None:
                self._release(scenario.id)
            else:
                if network is not None:
                    _remove_network(network)
                if cgroup is not None:
                    remove_cgroup(cgroup)
            raise
        port, metrics_port = listening["port"], listening.get("metrics_port") or None
        # On a network scenario the host reaches the service's address past the emulated link.
        host = network.link.service.address if network else HOST
        return ServiceHandle(
            scenario_id=scenario.id,
            service=scenario.target.service,
            address=Endpoint(host, port),
            k6_address=Endpoint(host, port),
            metrics_address=Endpoint(host, metrics_port) if metrics_port else None,
            prometheus_target=f"{host}:{metrics_port}" if metrics_port else None,
            workers=listening.get("workers"),
            limits=f"cgroup-v{cgroup.version}" if cgroup else "affinity",
            service_cpus=split.service,
            k6_cpus=split.k6,
            notes=tuple(notes),
            network=_network_record(network),
            network_path=_network_path(network),
            interpreter=listening.get("interpreter"),
        )

    def service_ended(self, handle: ServiceHandle) -> str | None:
        code = self._service(handle).process.poll()
        return None if code is None else f"exited with code {code}"

    def service_log_tail(self, handle: ServiceHandle) -> str:
        return tail_file(self._service(handle).log_file)

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        return self.run_k6_instances(handle, (invocation,), measured)[0]

    def run_k6_instances(
        self, handle: ServiceHandle, invocations: Sequence[K6Invocation], measured: bool
    ) -> tuple[K6Process, ...]:
        """One k6 process per invocation, all started together, each pinned to its own CPUs."""
        service = self._service(handle)
        env = {k: os.environ[k] for k in K6_INHERITED_ENV if k in os.environ}
        offsets = [inv.log_file.stat().st_size if inv.log_file.exists() else 0 for inv in invocations]
        before = self._sample(service) if measured else None
        reset = measured and service.cgroup is not None and reset_memory_peak(service.cgroup)
        peak_scope = "window" if reset else "lifetime"
        relay_before = _relay_cpu(service.network) if measured else None
        # k6 runs in the client's namespace: its requests cross the emulated link.
        prefix = exec_prefix(service.network.link.client.namespace) if service.network else []
        started = time.monotonic()
        processes: list[tuple[subprocess.Popen[bytes], float]] = []
        try:
            for invocation in invocations:
                with invocation.log_file.open("ab") as log:
                    process = subprocess.Popen(
                        [*prefix, str(self._settings.k6_binary), *invocation.run_args],
                        cwd=self._settings.root,
                        env=env | dict(invocation.env),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        # Set before exec: Go starts its threads early and they keep the mask they see.
                        preexec_fn=functools.partial(  # noqa: PLW1509
                            _enter_k6_cpus, invocation.cpus or handle.k6_cpus
                        ),
                    )
                processes.append((process, time.monotonic()))
            if len(processes) == 1:
                ended = [(_wait_with_usage(processes[0][0]), time.monotonic())]
            else:
                ended = _wait_all_with_usage([process for process, _ in processes])
        finally:
            for process, _ in processes:
                _reap_interrupted(process)
        wall = time.monotonic() - started
        if before is not None:
            service.window = _Window(before, self._sample(service), wall, peak_scope)
        # The userspace link emulator over the whole run: the same window for every instance.
        relay = delta(relay_before, _relay_cpu(service.network)) if measured else None
        return tuple(
            K6Process(
                exit_code=process.returncode,
                wall_seconds=wall if len(processes) == 1 else end - began,
                cpu_seconds=cpu_seconds,
                cpus=len(invocation.cpus or handle.k6_cpus),
                output_tail=tail_file(invocation.log_file, offset=offset),
                relay_cpu_seconds=relay,
            )
            for (process, began), (cpu_seconds, end), invocation, offset in zip(
                processes, ended, invocations, offsets, strict=True
            )
        )

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        service = self._release(handle.scenario_id)
        if service is None:
            return ServiceUsage.unmeasured(None, "")
        return _usage(service.window, service.process.returncode, tail_file(service.log_file))

    def close(self) -> None:
        with self._services_lock:
            left = list(self._services)
        for scenario_id in left:
            self._release(scenario_id)

    def _service(self, handle: ServiceHandle) -> _Service:
        with self._services_lock:
            return self._services[handle.scenario_id]

    def _release(self, scenario_id: str) -> _Service | None:
        """Stop the service and remove its cgroup; None when it is not running. It stays known until
        then, so a stop cut short (Ctrl-C on the main thread) is completed by close()."""
        with self._services_lock:
            service = self._services.get(scenario_id)
        if service is None:
            return None
        try:
            if service.cgroup is not None:
                # The measured window is over: shutting down at the profile's quota would only be slower.
                with contextlib.suppress(OSError):
                    set_cpu_quota(service.cgroup, service.scenario.profile.whole_cpus)
            _terminate(service.process, self._settings.stop_timeout_s)
            service.reader.join(timeout=2.0)  # EOF once every worker has closed stdout
        finally:
            try:
                if service.network is not None:
                    network, service.network = service.network, None  # removed once, even if cut short
                    _remove_network(network)
            finally:
                if service.cgroup is not None:
                    remove_cgroup(service.cgroup)
        with self._services_lock:
            self._services.pop(scenario_id, None)
        return service

    def _network(self, scenario: Scenario, relay_cpus: tuple[int, ...], notes: list[str]) -> _Network:
        """The scenario's namespaces, link, emulator and host access, verified against its profile.

        Any failure is the scenario's, in phase "network"; what was made is removed again.
        """
        profile = scenario.network
        try:
            require_net_admin()
            link = create_link(plan_link(self._settings.run_id, scenario.id, prefix=RUN_NAMESPACE_PREFIX))
        except NetworkError as exc:
            raise ScenarioFailed("network", str(exc)) from exc
        try:
            network = _Network(link, hold(link))
        except BaseException:
            remove_link(link)
            raise
        try:
            add_host_access(network.link)
            emulator = choose_emulator(relay_cpus)
            emulator.apply(network.link, profile)
            network.emulator = emulator
            network.measurement = verify(network.link, profile)
        except (NetworkError, LinkVerificationError) as exc:
            _remove_network(network)
            raise ScenarioFailed("network", str(exc)) from exc
        except BaseException:
            _remove_network(network)
            raise
        if network.emulator is not None and network.emulator.name == "userspace":
            notes.append(
                f"network {profile.name}: the userspace link emulator shares k6's CPUs "
                f"{','.join(map(str, relay_cpus))}"
            )
        return network

    def _cgroup(self, scenario: Scenario, notes: list[str]) -> Cgroup | None:
        name = f"{self._settings.run_id}-{scenario.id}"
        try:
            # The service starts at the speed of its whole CPUs and is measured at the profile's quota
            # (set once it listens): importing its modules is no part of what a profile limits,
            # and under a quarter CPU it took most of a scenario's overhead. The quota it reads
            # at start gives the same workers, ceil(cpus), as the profile's would.
            return create_cgroup(name, scenario.profile.whole_cpus, scenario.profile.memory_bytes)
        except CgroupUnavailable as exc:
            notes.append(
                f"limits approximate: {exc.strerror}; the service is only pinned to "
                f"{scenario.profile.whole_cpus} CPU(s) and its memory is not limited"
            )
            return None

    def _spawn(
        self,
        scenario: Scenario,
        cgroup: Cgroup | None,
        cpus: tuple[int, ...],
        log_file: Path,
        network: _Network | None = None,
    ) -> _Service:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # `ip netns exec` execs the service in place: the pid, cgroup and CPUs set here stay.
        prefix = exec_prefix(network.link.service.namespace) if network else []
        host = network.link.service.address if network else HOST
        with log_file.open("ab") as log:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", scenario.target.main_module],
                cwd=self._settings.root,
                env=self._service_env(scenario, host),
                stdout=subprocess.PIPE,
                stderr=log,
                # Own session: Ctrl-C reaches the runner only, which then stops the service
                # the same way every time (SIGTERM, grace, SIGKILL).
                start_new_session=True,
                preexec_fn=functools.partial(_enter_limits, cgroup, cpus),  # noqa: PLW1509
            )
        assert process.stdout is not None
        service = _Service(scenario, process, cgroup, cpus, log_file, threading.Thread(), network=network)
        service.reader = threading.Thread(
            target=_pump_stdout, args=(process.stdout, log_file, service), daemon=True
        )
        service.reader.start()
        return service

    def _await_listening(self, scenario: Scenario, service: _Service) -> dict[str, Any]:
        timeout = self._settings.start_timeout_s
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

    def _service_env(self, scenario: Scenario, host: str = HOST) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_KNOBS}
        env |= {"HOST": host, "PORT": "0", "METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}
        if scenario.target.tls:
            env["TLS_CERT_FILE"] = str(self._settings.certs_dir / "server.pem")
            env["TLS_KEY_FILE"] = str(self._settings.certs_dir / "server-key.pem")
        return env | service_env(scenario)

    def _sample(self, service: _Service) -> CgroupStats:
        if service.cgroup is not None:
            return read_stats(service.cgroup.paths)
        return _session_stats(service.process.pid, len(service.service_cpus))


def _remove_network(network: _Network) -> None:
    """Emulator off, then the namespaces (and with them the veths, TUN devices and host route)."""
    try:
        if network.emulator is not None:
            network.emulator.remove(network.link)
    finally:
        while network.held:
            os.close(network.held.pop())
        remove_link(network.link)


def _network_path(network: _Network | None) -> str:
    if network is None:
        return f"loopback {HOST}: k6 process to service process"
    emulator = network.emulator.name if network.emulator else "no emulator"
    return f"veth pair between network namespaces ({emulator}): k6 process to service process"


def _relay_cpu(network: _Network | None) -> float | None:
    """The userspace relay's CPU seconds so far; None for netem (kernel time) or a dead relay."""
    if network is None or network.emulator is None:
        return None
    try:
        usage = network.emulator.usage(network.link)
    except NetworkError:
        return None
    return None if usage is None else usage.cpu_s


def _network_record(network: _Network | None) -> dict[str, Any] | None:
    """What the result records of the link: the emulator and what verification measured."""
    if network is None:
        return None
    measurement = network.measurement
    relay = network.emulator if isinstance(network.emulator, UserspaceEmulator) else None
    return {
        "emulator": network.emulator.name if network.emulator else None,
        # Where the userspace relay runs (k6's CPUs); its CPU time is in the host section.
        "relay_cpus": list(relay.cpus) if relay else None,
        "service_address": network.link.service.address,
        "client_address": network.link.client.address,
        "measured_rtt_s": measurement.rtt_s if measurement else None,
        "measured_rate_bps": measurement.rate_bps if measurement else None,
    }


def _enter_limits(cgroup: Cgroup | None, cpus: tuple[int, ...]) -> None:
    """Runs in the child between fork and exec.

    preexec_fn is unsafe when the parent has threads that may hold locks at fork time;
    this function only makes system calls (open, write, sched_setaffinity, prctl), so none is needed.
    """
    if cgroup is not None:
        join_cgroup(cgroup)
    os.sched_setaffinity(0, cpus)
    # A runner killed outright (SIGKILL, OOM) cannot stop its service: the kernel asks it to
    # stop gracefully instead, and its workers follow their supervisor.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _enter_k6_cpus(cpus: tuple[int, ...]) -> None:
    """Runs in k6 between fork and exec: its CPUs, and no load from it once the runner is gone."""
    os.sched_setaffinity(0, cpus)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pump_stdout(stdout: IO[bytes], log_file: Path, service: _Service) -> None:
    """Copy the service's stdout to its log and catch the listening line; runs until EOF."""
    with log_file.open("ab") as log:
        for line in stdout:
            log.write(line)
            log.flush()
            if not service.listening:
                service.listening = listening_event([line])


def _wait_with_usage(process: subprocess.Popen[bytes]) -> float:
    """Wait for the child and return its CPU seconds (user + system) from wait4."""
    _, status, usage = os.wait4(process.pid, 0)
    # wait4 reaped the child, so Popen must be told its exit code.
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _wait_all_with_usage(processes: Sequence[subprocess.Popen[bytes]]) -> list[tuple[float, float]]:
    """Wait for every child; per child its CPU seconds (wait4) and when it ended (monotonic).

    Polled, so each instance's end is its own: a blocking wait on one would date the others late.
    """
    pending = {process.pid: process for process in processes}
    ended: dict[int, tuple[float, float]] = {}
    while pending:
        for pid, process in list(pending.items()):
            reaped, status, usage = os.wait4(pid, os.WNOHANG)
            if reaped:
                process.returncode = os.waitstatus_to_exitcode(status)
                ended[pid] = (usage.ru_utime + usage.ru_stime, time.monotonic())
                del pending[pid]
        if pending:
            time.sleep(_K6_POLL_S)
    return [ended[process.pid] for process in processes]


def _reap_interrupted(process: subprocess.Popen[bytes]) -> None:
    """After Ctrl-C k6 is still finishing: let it stop gracefully, then kill it."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=_K6_INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
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


def _session_stats(session_id: int, pinned_cpus: int) -> CgroupStats:
    """CPU seconds of every process in the service's session, for when no cgroup exists."""
    user_ticks = system_ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # Fields after the command name: state ppid pgrp session ... utime(12) stime(13).
        if int(fields[3]) == session_id:
            user_ticks += int(fields[11])
            system_ticks += int(fields[12])
    return CgroupStats(
        cpu_usage_seconds=(user_ticks + system_ticks) / _CLOCK_TICKS,
        cpu_periods=None,
        cpu_throttled_periods=None,
        cpu_throttled_seconds=None,
        cpu_limit_cores=float(pinned_cpus),
        memory_usage_bytes=None,
        memory_peak_bytes=None,
        memory_limit_bytes=None,
        cpu_user_seconds=user_ticks / _CLOCK_TICKS,
        cpu_system_seconds=system_ticks / _CLOCK_TICKS,
    )


def _usage(window: _Window | None, exit_code: int | None, log_tail: str) -> ServiceUsage:
    if window is None:
        return ServiceUsage.unmeasured(exit_code, log_tail)
    before, after = window.before, window.after
    return ServiceUsage(
        window_seconds=window.wall_seconds,
        cpu_seconds=delta(before.cpu_usage_seconds, after.cpu_usage_seconds),
        cpu_limit_cores=after.cpu_limit_cores,
        cpu_periods=delta(before.cpu_periods, after.cpu_periods),
        throttled_periods=delta(before.cpu_throttled_periods, after.cpu_throttled_periods),
        throttled_seconds=delta(before.cpu_throttled_seconds, after.cpu_throttled_seconds),
        memory_peak_bytes=after.memory_peak_bytes,
        memory_peak_scope=window.memory_peak_scope if after.memory_peak_bytes is not None else None,
        memory_limit_bytes=after.memory_limit_bytes,
        exit_code=exit_code,
        log_tail=log_tail,
        user_cpu_seconds=delta(before.cpu_user_seconds, after.cpu_user_seconds),
        system_cpu_seconds=delta(before.cpu_system_seconds, after.cpu_system_seconds),
    )
