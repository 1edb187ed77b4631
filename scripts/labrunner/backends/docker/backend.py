"""The docker backend: each scenario's service a container under its profile's limits, k6 one beside it."""

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container
from docker.types import Ulimit
from requests.exceptions import RequestException

from labrunner.backends.base import (
    BackendSettings,
    BackendUnavailable,
    Endpoint,
    K6Invocation,
    K6Process,
    ScenarioFailed,
    ServiceHandle,
    ServiceUsage,
    check_profile_fits,
    shared_cpus_note,
    tail,
)
from labrunner.backends.cgroups import CpuSplit, split_cpus
from labrunner.backends.connections import TABLES, established
from labrunner.backends.docker.archives import copy_results, k6_files
from labrunner.backends.docker.certs import adopt_certs
from labrunner.backends.docker.containers import create_container, docker_errors, logs_tail, remove
from labrunner.backends.docker.k6 import K6Containers
from labrunner.backends.docker.names import (
    K6_IMAGE,
    NETWORK,
    NOFILE,
    compose_name,
    container_name,
    image_name,
)
from labrunner.backends.docker.network_helper import NetworkHelpers
from labrunner.backends.docker.preflight import (
    EngineClients,
    check_engine_version,
    check_lab_is_up,
    check_publish_address,
    checked,
    prepare_engines,
)
from labrunner.backends.docker.services import (
    ServiceContainer,
    apply_profile_quota,
    await_listening,
    image_ports,
    published_port,
    service_params,
    stop_service_container,
)
from labrunner.backends.docker.stats import (
    UsageWindow,
    cpu_until_all_exit,
    memory_peak,
    stats,
    usage_from_stats,
)
from labrunner.backends.engines import DEFAULT_SOCKET, Engine, EngineSilent, silence
from labrunner.backends.engines import connect as connect_engine
from labrunner.model.engine_roles import LOCAL_ENGINE
from labrunner.model.scenario import K6Instances, Profile, Scenario
from labrunner.say import Say

PROBE_TIMEOUT_S = 5  # `--backend auto` must not hang on an engine that does not answer
API_TIMEOUT_S = 60  # the docker SDK's default
# One k6 container of a run: its invocation, the container, its CPU count and where it runs.
_K6Run = tuple[K6Invocation, Container, int, str | None]


def probe() -> str:
    """Why `auto` may take docker: the engine answers and the lab is up on it; else BackendUnavailable,
    each in one sentence."""
    try:
        client = connect_engine(LOCAL_ENGINE, "Docker", PROBE_TIMEOUT_S).client
    except EngineSilent as exc:
        raise BackendUnavailable(f"no Docker engine answered at {exc.url} ({exc.why})") from None
    try:
        version = check_engine_version(client)
        try:
            client.networks.get(NETWORK)
        except NotFound:
            raise BackendUnavailable(
                f"Docker engine {version} answers but the lab is not up (no {NETWORK} network): "
                "run `docker compose up -d`"
            ) from None
    except (DockerException, RequestException) as exc:
        why = silence(exc, PROBE_TIMEOUT_S)
        raise BackendUnavailable(f"the Docker engine stopped answering ({why})") from None
    finally:
        client.close()  # create connects again, with the run's timeouts
    return f"Docker engine {version} answers and the lab is up"


def create(settings: BackendSettings, say: Say) -> "DockerBackend":
    """The backend on the engines [hosts] names; every engine must answer now, or the run stops here.

    Engines are told apart by their address, so the service's engine named twice (`local`, its
    socket's URL, a context) is one engine: k6 then runs beside the service, as without [hosts].
    """
    roles = settings.hosts
    try:
        service = checked(connect_engine(roles.service, "service", API_TIMEOUT_S), "service")
        by_url = {service.url: service}
        load = []
        for name in roles.load:
            engine = connect_engine(name, "load", API_TIMEOUT_S)
            if engine.url in by_url:
                engine.client.close()
            else:
                by_url[engine.url] = checked(engine, "load")
            load.append(by_url[engine.url])
    except (BackendUnavailable, DockerException, RequestException) as exc:
        raise BackendUnavailable(f"--backend docker: {exc}; start Docker or use --backend local") from exc
    apart = any(engine is not service for engine in load)
    try:
        finisher = connect_engine(roles.service, "service", API_TIMEOUT_S).client
        return DockerBackend(
            settings,
            service.client,
            say,
            service_url=service.url,
            load=load if apart else (),
            finisher_client=finisher,
        )
    except (DockerException, RequestException) as exc:  # e.g. a load engine that cannot pull k6
        raise BackendUnavailable(f"--backend docker: {exc}") from exc


class DockerBackend:
    """Services from the compose-built images on the compose network, k6 from its official image."""

    name = "docker"

    def __init__(
        self,
        settings: BackendSettings,
        client: docker.DockerClient,
        say: Say = print,
        service_url: str | None = None,
        load: Sequence[Engine] = (),
        *,
        finisher_client: docker.DockerClient | None = None,
    ) -> None:
        """`client` runs the services; `load`, when k6 runs on other engines (one may be the
        service's), their engines in [hosts] order; empty: k6 beside the service on its network.
        `finisher_client`: a second client of the service's engine, for stops on the finisher
        thread (the docker SDK's client, a requests session, is not documented as thread-safe);
        None: `client` serves both, as a test's fake can."""
        self._settings = settings
        self._client = client
        self._finisher_client = finisher_client or client
        self._service_url = service_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._load = tuple(load)
        self._publish = settings.hosts.publish_address
        check_publish_address(self._load, self._publish)
        # Written by start_service on the main thread and by stop_service on the finisher's.
        self._services: dict[str, ServiceContainer] = {}
        self._services_lock = threading.Lock()
        self._certs_adopted = False
        check_lab_is_up(client)
        self._network_helpers = NetworkHelpers(client, settings, say)
        info = client.info()
        self._cpus = int(info["NCPU"])
        self._memory = info.get("MemTotal")  # bytes; a profile limit not below it is noted
        load_cpus = {engine.name: int(engine.client.info()["NCPU"]) for engine in self._load}
        # The same variables docker-compose.yml reads, so the runner's containers match compose's.
        k6_image = os.environ.get("K6_IMAGE") or K6_IMAGE
        nofile = int(os.environ.get("SERVICE_NOFILE") or NOFILE)
        self._ulimits = [Ulimit(name="nofile", soft=nofile, hard=nofile)]
        self._k6 = K6Containers(settings, client, self._cpus, self._load, load_cpus, k6_image, self._ulimits)
        prepare_engines(self._clients(), self._k6.clients(), k6_image, say)

    @property
    def cpus_elsewhere(self) -> str | None:
        if self._load:
            names = ", ".join(engine.name for engine in self._load)
            return f"k6 runs on load engine(s) {names}, apart from the service: their CPUs are not read"
        if not self._service_url.startswith("unix://"):
            return f"the Docker engine at {self._service_url} is not this host: its CPUs cannot be read here"
        return None

    def check_k6_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        self._k6.check_instances(profile, k6_instances)

    def start_service(self, scenario: Scenario) -> ServiceHandle:
        profile, target = scenario.profile, scenario.target
        image = image_name(target.service)
        check_profile_fits(profile, self._cpus, f"the Docker engine has {self._cpus}")
        if self._load and scenario.network.emulated:
            raise ScenarioFailed(
                "network",
                f"network {scenario.network.name}: k6 on other engines reaches the service over the real "
                "network between the hosts; emulated profiles need k6 beside the service (one engine)",
            )
        with docker_errors("start"):
            port, metrics_port = image_ports(self._client, image)
        split = split_cpus(range(self._cpus), profile.whole_cpus)
        notes = self._limit_notes(profile, split)
        name = container_name(self._settings.run_id, scenario.id)
        params = service_params(
            self._settings,
            scenario,
            image=image,
            name=name,
            ports=(port, metrics_port),
            cpus=split.service,
            ulimits=self._ulimits,
        )
        container = create_container(self._client, "start", **params)
        service = ServiceContainer(scenario, container, compose_name(target.service), port=port)
        with self._services_lock:
            self._services[scenario.id] = service
        network: dict[str, Any] | None = None
        try:
            with docker_errors("start"):
                if target.tls and not self._certs_adopted:
                    notes += adopt_certs(container, self._settings.certs_dir, self._publish)
                    self._certs_adopted = True  # after the check: every TLS scenario fails the same way
                container.start()
                listening = await_listening(service, self._settings.start_timeout_s)
                apply_profile_quota(service)  # reloads the container
                host_port = published_port(container, port, self._publish)
                published_metrics = listening.get("metrics_port") or None
                host_metrics_port = (
                    published_port(container, metrics_port, self._publish) if published_metrics else None
                )
                service.ip = container.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
            if scenario.network.emulated:
                network = self._network_helpers.emulate(service, split.k6)
        except BaseException:
            self._release(scenario.id)  # no handle reaches the runner, so remove it here
            raise
        published = Endpoint(self._publish, host_port)
        k6 = self._k6.route(service, port, published, split.k6)
        return ServiceHandle(
            scenario_id=scenario.id,
            service=target.service,
            address=published,
            k6_address=k6.address,
            metrics_address=Endpoint(self._publish, host_metrics_port) if host_metrics_port else None,
            prometheus_target=f"{name}:{metrics_port}" if published_metrics else None,
            workers=listening.get("workers"),
            limits="docker",
            service_cpus=split.service,
            k6_cpus=k6.cpus,
            notes=tuple(notes),
            network=network,
            network_path=k6.path,
            interpreter=listening.get("interpreter"),
            k6_places=k6.places,
        )

    def service_ended(self, handle: ServiceHandle) -> str | None:
        container = self._service(handle).container
        with docker_errors("health"):
            container.reload()
        if container.status == "running":
            return None
        return f"{container.status} (exit code {container.attrs['State'].get('ExitCode')})"

    def service_log_tail(self, handle: ServiceHandle) -> str:
        return logs_tail(self._service(handle).container)

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        return self.run_k6_instances(handle, [invocation], measured)[0]

    def run_k6_instances(
        self, handle: ServiceHandle, invocations: Sequence[K6Invocation], measured: bool
    ) -> tuple[K6Process, ...]:
        """One k6 container per invocation, started together, each on its own cpuset; on other
        engines, k6's files go in and its summary and raw samples come out through the engine's API
        (a bind mount would name a directory of the engine's host, not of this one)."""
        if any(invocation.python_driven for invocation in invocations):
            raise ScenarioFailed(
                "measure" if measured else "warmup", "the Python driver runs on the local backend only"
            )
        service = self._service(handle)
        phase = "measure" if measured else "warmup"
        runs: list[_K6Run] = []
        try:
            for index, invocation in enumerate(invocations, start=1):
                client, cpus, place = self._k6.place(handle, service.scenario.profile, invocation)
                suffix = "" if len(invocations) == 1 else f"-{index}"
                name = f"{service.container.name}-k6{suffix}"
                params = self._k6.params(service, invocation, phase, cpus, name)
                container = create_container(client, phase, **params)
                runs.append((invocation, container, len(cpus), place))
                if self._load:
                    with docker_errors(phase):
                        container.put_archive("/", k6_files(self._settings.root, self._settings.certs_dir))
            with docker_errors(phase):
                before = stats(service.container) if measured else None
                started = time.monotonic()
                for _, container, _, _ in runs:
                    container.start()
                cpu_ns = cpu_until_all_exit([container for _, container, _, _ in runs])
                wall = time.monotonic() - started
                if before is not None:
                    after = stats(service.container)
                    # Without a peak in the stats (cgroup v2), ask the service for its cgroup's.
                    peak = memory_peak(handle) if after.memory_max_usage is None else None
                    service.window = UsageWindow(before, after, wall, peak)
                processes = [self._k6_ended(run, wall, cpu) for run, cpu in zip(runs, cpu_ns, strict=True)]
        finally:
            for _, container, _, _ in runs:
                remove(container)  # also on Ctrl-C: force stops k6
        return tuple(processes)

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        released = self._release(handle.scenario_id)
        if released is None:
            return ServiceUsage.unmeasured(None, "")
        service, exit_code, log_tail = released
        return usage_from_stats(service.window, service.scenario.profile.cpus, exit_code, log_tail)

    def close(self) -> None:
        with self._services_lock:
            left = list(self._services)
        for scenario_id in left:
            self._release(scenario_id)
        # A create interrupted by Ctrl-C may still have made its container: none of this run's stays.
        for client, _ in self._clients():
            with contextlib.suppress(DockerException):
                for container in client.containers.list(
                    all=True, filters={"label": f"protolab.run={self._settings.run_id}"}
                ):
                    remove(container)

    def _clients(self) -> EngineClients:
        """Each engine's client once, with " on engine <name>" for messages ("" for the service's)."""
        others = [engine for engine in self._load if engine.client is not self._client]
        return [(self._client, ""), *((engine.client, f" on engine {engine.name}") for engine in others)]

    def _limit_notes(self, profile: Profile, split: CpuSplit) -> list[str]:
        """What the report notes about limits that do not hold apart: shared CPUs, memory not bound."""
        notes: list[str] = []
        if split.shared and not self._load:
            notes.append(shared_cpus_note(split.k6, f"the Docker engine has {self._cpus} CPUs", profile))
        if self._memory is not None and profile.memory_bytes >= self._memory:
            notes.append(
                f"profile {profile.name}'s memory limit ({profile.memory_bytes // 2**20} MiB) is not below "
                f"the engine's memory ({self._memory // 2**20} MiB): it does not bind"
            )
        return notes

    def _k6_ended(self, run: _K6Run, wall: float, cpu_ns: int | None) -> K6Process:
        """An exited k6 container's process: its exit code, its log kept (and its results copied
        out of another engine)."""
        invocation, container, cpu_count, place = run
        exit_code = int(container.wait()["StatusCode"])
        output = container.logs(stdout=True, stderr=True)
        if self._load:
            copy_results(container, invocation)
        invocation.log_file.parent.mkdir(parents=True, exist_ok=True)
        with invocation.log_file.open("ab") as log:
            log.write(output)
        return K6Process(
            exit_code=exit_code,
            wall_seconds=wall,
            cpu_seconds=None if cpu_ns is None else cpu_ns / 1e9,
            cpus=cpu_count,
            output_tail=tail(output),
            placement=place,
        )

    def service_connections(self, handle: ServiceHandle) -> int | None:
        """Counted by a `cat` of /proc/net in the service's container (its namespace's): an exec,
        which its quota pays for, so the runner counts only a few times a run (run.connections)."""
        service = self._service(handle)
        try:
            exit_code, output = service.container.exec_run(["cat", *TABLES])
        except (DockerException, RequestException):
            return None
        if exit_code != 0 or not isinstance(output, bytes):
            return None
        return established(output.decode(errors="replace"), service.port)

    def _service(self, handle: ServiceHandle) -> ServiceContainer:
        with self._services_lock:
            return self._services[handle.scenario_id]

    def _release(self, scenario_id: str) -> tuple[ServiceContainer, int | None, str] | None:
        """Stop the service, keep its log, remove it; None when not running. It stays known until
        then, so a stop cut short (Ctrl-C on the main thread) is completed by close()."""
        with self._services_lock:
            service = self._services.get(scenario_id)
        if service is None:
            return None
        log_file = self._settings.logs_dir / f"{scenario_id}.service.log"
        # Through this thread's own client: the container object carries the one that made it.
        on_main = threading.current_thread() is threading.main_thread()
        client = self._client if on_main else self._finisher_client
        with docker_errors("stop"):
            try:
                container = client.containers.get(container_name(self._settings.run_id, scenario_id))
            except NotFound:
                container = None
        exit_code: int | None = None  # unknown when a stop cut short had removed it already
        log_tail = ""
        if container is not None:
            exit_code, log_tail = stop_service_container(container, self._settings.stop_timeout_s, log_file)
        with self._services_lock:
            self._services.pop(scenario_id, None)
        return service, exit_code, log_tail
