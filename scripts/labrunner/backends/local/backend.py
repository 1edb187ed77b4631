"""The local backend's face: each scenario's service started, observed and stopped with its cgroup,
network and k6 runs, which its sibling modules make, measure and remove."""

import contextlib
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from labrunner import interrupts
from labrunner.backends.base import (
    BackendSettings,
    BackendUnavailable,
    Endpoint,
    K6Invocation,
    K6Process,
    ServiceHandle,
    ServiceUsage,
    check_profile_fits,
    delta,
    k6_instances_problem,
    shared_cpus_note,
    tail_file,
)
from labrunner.backends.cgroups import (
    Cgroup,
    pin_threads,
    remove_cgroup,
    reset_memory_peak,
    set_cpu_quota,
    split_cpus,
)
from labrunner.backends.connections import seen_by
from labrunner.backends.local.k6 import run_k6
from labrunner.backends.local.limits import service_cgroup
from labrunner.backends.local.network import (
    HOST,
    Network,
    create_network,
    network_path,
    network_record,
    relay_cpu,
    remove_network,
    remove_run_leftovers,
)
from labrunner.backends.local.service import Service, await_listening, spawn, terminate
from labrunner.backends.local.usage import Window, sample, usage
from labrunner.model.scenario import K6Instances, Profile, Scenario
from labrunner.say import Say
from services.common.cgroup import CgroupStats


def probe() -> str:
    """The local backend runs wherever Python does; how well it limits the service, it says per scenario."""
    return "local processes"


def create(settings: BackendSettings, say: Say) -> "LocalBackend":
    del say  # the local backend reports through each scenario's notes
    return LocalBackend(settings)


class LocalBackend:
    """Services from `python -m services.<name>` (or a target's module), k6 from this host; both bound
    to 127.0.0.1."""

    name = "local"
    cpus_elsewhere = None  # everything runs on this host

    def __init__(self, settings: BackendSettings) -> None:
        self._settings = settings
        # Written by start_service on the main thread and by stop_service on the finisher's.
        self._services: dict[str, Service] = {}
        self._services_lock = threading.Lock()
        if os.geteuid() == 0:
            remove_run_leftovers()

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
        network: Network | None = None
        service: Service | None = None  # once set, also known to _release
        try:
            if scenario.network.emulated:
                network = create_network(self._settings.run_id, scenario, split.k6, notes)
            # In a cgroup (its quota, not its CPUs, sets its workers) the service starts on every CPU:
            # a duet's two services import their modules at once, on the two sides of a 2-CPU host.
            # Not behind `ip netns exec`, whose own /sys hides the quota: the service counts its CPUs.
            on_every_cpu = cgroup is not None and network is None
            start_cpus = tuple(available) if on_every_cpu else split.service
            with interrupts.held():  # a Ctrl-C inside Popen would leave the child running, unknown
                service = self._spawn(
                    scenario, cgroup, split.service, log_file, network, start_cpus=start_cpus
                )
                with self._services_lock:
                    self._services[scenario.id] = service
            listening = await_listening(scenario, service, self._settings.start_timeout_s)
            if cgroup is not None:
                if on_every_cpu:
                    pin_threads(cgroup, split.service)
                set_cpu_quota(cgroup, profile.cpus)
        except BaseException:
            # No handle reaches the runner, so what was made is removed here.
            if service is not None:
                self._release(scenario.id)
            else:
                if network is not None:
                    remove_network(network)
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
            network=network_record(network),
            network_path=network_path(network),
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
        before = self._sample(service) if measured else None
        reset = measured and service.cgroup is not None and reset_memory_peak(service.cgroup)
        peak_scope = "window" if reset else "lifetime"
        relay_before = relay_cpu(service.network) if measured else None
        # k6 runs in the client's namespace: its requests cross the emulated link.
        namespace = service.network.link.client.namespace if service.network else None
        runs = run_k6(self._settings, invocations, handle.k6_cpus, namespace)
        if before is not None:
            service.window = Window(before, self._sample(service), runs.wall_seconds, peak_scope)
        # The userspace link emulator over the whole run: the same window for every instance.
        return runs.results(delta(relay_before, relay_cpu(service.network)) if measured else None)

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        service = self._release(handle.scenario_id)
        if service is None:
            return ServiceUsage.unmeasured(None, "")
        return usage(service.window, service.process.returncode, tail_file(service.log_file))

    def close(self) -> None:
        with self._services_lock:
            left = list(self._services)
        for scenario_id in left:
            self._release(scenario_id)

    def service_connections(self, handle: ServiceHandle) -> int | None:
        """Counted in the service process's own view of /proc/net (its namespace's)."""
        return seen_by(self._service(handle).process.pid, handle.address.port)

    def _service(self, handle: ServiceHandle) -> Service:
        with self._services_lock:
            return self._services[handle.scenario_id]

    def _release(self, scenario_id: str) -> Service | None:
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
            terminate(service.process, self._settings.stop_timeout_s)
            service.reader.join(timeout=2.0)  # EOF once every worker has closed stdout
        finally:
            try:
                if service.network is not None:
                    network, service.network = service.network, None  # removed once, even if cut short
                    remove_network(network)
            finally:
                if service.cgroup is not None:
                    remove_cgroup(service.cgroup)
                shutil.rmtree(service.metrics_dir, ignore_errors=True)
        with self._services_lock:
            self._services.pop(scenario_id, None)
        return service

    def _cgroup(self, scenario: Scenario, notes: list[str]) -> Cgroup | None:
        return service_cgroup(self._settings.run_id, scenario, notes)

    def _spawn(
        self,
        scenario: Scenario,
        cgroup: Cgroup | None,
        cpus: tuple[int, ...],
        log_file: Path,
        network: Network | None = None,
        *,
        start_cpus: tuple[int, ...] | None = None,
    ) -> Service:
        return spawn(self._settings, scenario, cgroup, cpus, log_file, network=network, start_cpus=start_cpus)

    def _sample(self, service: Service) -> CgroupStats:
        return sample(service.cgroup, service.process.pid, len(service.service_cpus))
