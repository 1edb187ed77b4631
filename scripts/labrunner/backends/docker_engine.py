"""The docker backend: each scenario's service a container under its profile's limits, k6 one beside it."""

import contextlib
import hashlib
import io
import ipaddress
import itertools
import json
import math
import os
import re
import shlex
import shutil
import statistics
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import docker
import httpx
from docker.errors import BuildError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import Ulimit
from requests.exceptions import RequestException

from labrunner import certs
from labrunner.backends.base import (
    LOG_TAIL_LINES,
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
    cpu_list,
    delta,
    k6_instances_problem,
    listening_event,
    service_env,
    shared_cpus_note,
    tail,
)
from labrunner.backends.cgroups import split_cpus
from labrunner.backends.engines import DEFAULT_SOCKET, Engine
from labrunner.backends.engines import connect as connect_engine
from labrunner.model.engine_roles import LOCAL_ENGINE
from labrunner.model.matrix import K6Instances, Profile, Scenario
from labrunner.network.emulators import netem_qdisc_commands, tbf_qdisc_commands
from labrunner.network.link_checks import LinkMeasurement
from labrunner.network.profiles import NetworkProfile
from labrunner.say import Say

# Names docker-compose.yml fixes (tests/test_docker_backend.py checks they agree).
NETWORK = "protolab"  # networks.default.name
CERTS_VOLUME = "protolab-certs"  # volumes.certs.name, filled by the one-shot `certs` service
K6_IMAGE = "grafana/k6:1.1.0"  # services.k6.image's default; K6_IMAGE overrides both
INFLUXDB_IN_NETWORK = "influxdb:8086"  # the influxdb service as k6 reaches it on the network
CERTS_DIR = "/certs"
K6_DIR, PROTO_DIR, RESULTS_DIR = "/k6", "/proto", "/results"
# The hardening every compose service under test has (x-service in docker-compose.yml).
SERVICE_HARDENING: Mapping[str, Any] = {
    "init": True,  # tini as PID 1 forwards SIGTERM to the supervisor and reaps workers
    "read_only": True,
    "tmpfs": {"/tmp": ""},  # PROMETHEUS_MULTIPROC_DIR lives here
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges:true"],
}
NOFILE = 65536  # services' and k6's ulimits.nofile default; SERVICE_NOFILE overrides both
# Engine 25 brought healthcheck start_interval, which docker-compose.yml uses; Compose v2 needs it too.
MIN_ENGINE_VERSION = (25, 0)
MANAGED_LABEL = "protolab.managed"
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
_DNS_LABEL_MAX = 63  # Prometheus resolves the container name: it must be one DNS label
PROBE_TIMEOUT_S = 5  # `--backend auto` must not hang on an engine that does not answer
API_TIMEOUT_S = 60  # the docker SDK's default
_POLL_S = 0.2
_K6_POLL_S = 0.5
_METRICS_TIMEOUT_S = 10.0
# Network conditions (README "Network conditions"): a helper container with NET_ADMIN joins the
# service container's network namespace and puts tc qdiscs on its interface; the service never
# gets NET_ADMIN. Both directions are emulated there: egress on eth0, ingress redirected through
# an ifb device whose egress carries the same qdiscs (k6's containers come and go per run, so
# the service's side, which lives for the whole scenario, holds both).
NETWORK_HELPER_IMAGE = "protolab-network-helper:local"
NETWORK_HELPER_DIR = "network-helper"  # its Dockerfile, under the repository root
PYTHON_IMAGE = "python:3.11.15-slim-bookworm"  # services/Dockerfile's default; PYTHON_IMAGE overrides
SERVICE_DEVICE = "eth0"  # the service's one network (the compose network) is its first interface
IFB_DEVICE = "plab-ifb"  # in the service's namespace only: the name cannot clash
NO_NETEM = "Specified qdisc kind is unknown"  # what tc answers where sch_netem is missing
PROBE_FILE = Path("scripts") / "labrunner" / "network" / "docker_probe.py"
PROBE_IN_CONTAINER = "/probe/docker_probe.py"
PROBE_PORT = 5201  # in the service's namespace, beside the service's own ports
PROBE_RTT_SAMPLES = 21
PROBE_RATE_SECONDS = 3.0
_HELPER_TIMEOUT_S = 60
_CERT_MODES = {
    certs.CA_FILE: certs.CERT_MODE,
    certs.CA_KEY_FILE: certs.KEY_MODE,
    certs.SERVER_FILE: certs.CERT_MODE,
    certs.SERVER_KEY_FILE: certs.KEY_MODE,
}


@dataclass(frozen=True)
class StatsSnapshot:
    """The fields of one `docker stats` sample that a scenario's usage is computed from."""

    cpu_ns: int | None
    periods: int | None
    throttled_periods: int | None
    throttled_ns: int | None
    memory_max_usage: int | None  # cgroup v1 only; v2 engines leave it out
    memory_limit: int | None

    @classmethod
    def parse(cls, stats: Mapping[str, Any]) -> "StatsSnapshot":
        cpu = stats.get("cpu_stats") or {}
        throttling = cpu.get("throttling_data") or {}
        memory = stats.get("memory_stats") or {}
        return cls(
            cpu_ns=(cpu.get("cpu_usage") or {}).get("total_usage"),
            periods=throttling.get("periods"),
            throttled_periods=throttling.get("throttled_periods"),
            throttled_ns=throttling.get("throttled_time"),
            memory_max_usage=memory.get("max_usage"),
            memory_limit=memory.get("limit"),
        )


@dataclass(frozen=True)
class UsageWindow:
    """The service's stats at the start and end of the measured k6 run."""

    before: StatsSnapshot
    after: StatsSnapshot
    wall_seconds: float
    memory_peak_metric: int | None  # protolab_cgroup_memory_peak_bytes, read when stats lack a peak


@dataclass
class _Service:
    """Mutable state of one service container, private to the backend."""

    scenario: Scenario
    container: Container
    hostname: str  # the compose service name k6 dials: the certificate's SAN
    ip: str = ""
    window: UsageWindow | None = None


def probe() -> str:
    """Why `auto` may take docker: the engine answers and the lab is up on it; else BackendUnavailable."""
    client = connect_engine(LOCAL_ENGINE, "Docker", PROBE_TIMEOUT_S).client
    try:
        version = check_engine_version(client)
        try:
            client.networks.get(NETWORK)
        except NotFound:
            raise BackendUnavailable(
                f"Docker engine {version} answered, but the lab is not up on it (no network {NETWORK}; "
                "start it with `docker compose up -d`)"
            ) from None
    finally:
        client.close()  # create connects again, with the run's timeouts
    return f"Docker engine {version} answered"


def create(settings: BackendSettings, say: Say) -> "DockerBackend":
    """The backend on the engines [hosts] names; every engine must answer now, or the run stops here.

    Engines are told apart by their address, so the service's engine named twice (`local`, its
    socket's URL, a context) is one engine: k6 then runs beside the service, as without [hosts].
    """
    roles = settings.hosts
    try:
        service = _checked(connect_engine(roles.service, "service", API_TIMEOUT_S), "service")
        by_url = {service.url: service}
        load = []
        for name in roles.load:
            engine = connect_engine(name, "load", API_TIMEOUT_S)
            if engine.url in by_url:
                engine.client.close()
            else:
                by_url[engine.url] = _checked(engine, "load")
            load.append(by_url[engine.url])
    except (BackendUnavailable, DockerException, RequestException) as exc:
        raise BackendUnavailable(f"--backend docker: {exc}; start Docker or use --backend local") from exc
    apart = any(engine is not service for engine in load)
    try:
        return DockerBackend(
            settings, service.client, say, service_url=service.url, load=load if apart else ()
        )
    except (DockerException, RequestException) as exc:  # e.g. a load engine that cannot pull k6
        raise BackendUnavailable(f"--backend docker: {exc}") from exc


def _checked(engine: Engine, role: str) -> Engine:
    """The engine, when its version is new enough; BackendUnavailable naming it otherwise."""
    try:
        check_engine_version(engine.client)
    except (BackendUnavailable, DockerException, RequestException) as exc:
        raise BackendUnavailable(f"{engine.describe(role)}: {exc}") from None
    return engine


def check_engine_version(client: docker.DockerClient) -> str:
    """The engine's version; BackendUnavailable when it is older than the lab needs."""
    version = str(client.version().get("Version", "unknown"))
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) < MIN_ENGINE_VERSION:
        need = ".".join(map(str, MIN_ENGINE_VERSION))
        raise BackendUnavailable(
            f"Docker engine {version} answered, but the lab needs Engine {need} or newer "
            "(compose's healthcheck start_interval); upgrade Docker or use --backend local"
        )
    return version


def image_name(service: str) -> str:
    """The image docker-compose.yml builds for a service module: protolab-rest-aiohttp:local."""
    return f"protolab-{compose_name(service)}:local"


def compose_name(service: str) -> str:
    """The compose service (and certificate SAN) of a service module: rest_aiohttp -> rest-aiohttp."""
    return service.replace("_", "-")


def container_name(run_id: str, scenario_id: str) -> str:
    """Unique per run and scenario, and a valid DNS label, since Prometheus scrapes it by name."""
    name = "protolab-" + re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{scenario_id}".lower()).strip("-")
    if len(name) <= _DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _DNS_LABEL_MAX - 9].rstrip('-')}-{digest}"


def remove_leftovers(client: docker.DockerClient, running_too: bool = True) -> list[str]:
    """Remove every container an earlier, interrupted run left behind (running_too=False: the
    stopped ones only); their names."""
    filters: dict[str, Any] = {"label": f"{MANAGED_LABEL}=true"}
    if not running_too:
        filters["status"] = ["created", "exited", "dead"]
    leftovers = client.containers.list(all=True, filters=filters)
    for container in leftovers:
        _remove(container)
    # A listed container always has a name; the stubs allow None for one not yet inspected.
    return [container.name or container.short_id for container in leftovers]


def usage_from_stats(
    window: UsageWindow | None, cpu_limit_cores: float, exit_code: int | None, log_tail: str
) -> ServiceUsage:
    """The service's usage over the measured window from the stats taken at its start and end."""
    if window is None:
        return ServiceUsage.unmeasured(exit_code, log_tail)
    before, after = window.before, window.after
    throttled_ns = delta(before.throttled_ns, after.throttled_ns)
    cpu_ns = delta(before.cpu_ns, after.cpu_ns)
    peak = after.memory_max_usage if after.memory_max_usage is not None else window.memory_peak_metric
    return ServiceUsage(
        window_seconds=window.wall_seconds,
        cpu_seconds=None if cpu_ns is None else cpu_ns / 1e9,
        cpu_limit_cores=cpu_limit_cores,
        cpu_periods=delta(before.periods, after.periods),
        throttled_periods=delta(before.throttled_periods, after.throttled_periods),
        throttled_seconds=None if throttled_ns is None else throttled_ns / 1e9,
        memory_peak_bytes=peak,
        # Docker cannot reset the peak, but the container is as old as the scenario.
        memory_peak_scope="lifetime" if peak is not None else None,
        memory_limit_bytes=after.memory_limit,
        exit_code=exit_code,
        log_tail=log_tail,
    )


INPUTS_LABEL = "protolab.inputs"  # the network helper image's: a hash of what it was built from


def helper_inputs(dockerfile: bytes, base: str, base_id: str) -> str:
    """What the network helper image is built from (its Dockerfile, the base's name and, when the
    engine has it, the base's image id); a different answer means it must be rebuilt."""
    return hashlib.sha256(b"\0".join([dockerfile, base.encode(), base_id.encode()])).hexdigest()[:16]


def emulator_name(profile: NetworkProfile) -> str:
    """netem for delay, jitter or loss; tbf alone for a rate-only profile (every kernel has tbf)."""
    return "netem" if profile.delay_s or profile.jitter_s or profile.loss_percent else "tbf"


def tc_commands(profile: NetworkProfile) -> list[list[str]]:
    """The commands the tc helper runs in the service's namespace, in order.

    The egress qdisc comes first, so that a kernel without netem stops the helper before it
    changes anything. The ingress side: every packet arriving on eth0 is redirected to an ifb
    device, whose egress has the same qdiscs, so k6's requests see the profile too.
    """
    qdiscs = netem_qdisc_commands if emulator_name(profile) == "netem" else tbf_qdisc_commands
    ifb = IFB_DEVICE
    return [
        *qdiscs(["tc"], SERVICE_DEVICE, profile),
        ["ip", "link", "add", ifb, "type", "ifb"],
        ["ip", "link", "set", ifb, "up"],
        ["tc", "qdisc", "add", "dev", SERVICE_DEVICE, "handle", "ffff:", "ingress"],
        # Every packet arriving on eth0 (any protocol) leaves through the ifb device instead.
        shlex.split(
            f"tc filter add dev {SERVICE_DEVICE} parent ffff: protocol all u32 match u32 0 0 "
            f"action mirred egress redirect dev {ifb}"
        ),
        *qdiscs(["tc"], ifb, profile),
    ]


def tc_helper_params(profile: NetworkProfile, service: Container) -> dict[str, Any]:
    """The tc helper: tc_commands as one `sh -e` script in the service's network namespace, as root
    with NET_ADMIN as its only capability."""
    script = "\n".join(shlex.join(command) for command in tc_commands(profile))
    return {
        "command": ["sh", "-exc", script],  # -x: its log shows which command failed
        "network_mode": f"container:{service.id}",
        "user": "0:0",
        "cap_drop": ["ALL"],
        "cap_add": ["NET_ADMIN"],
        "security_opt": ["no-new-privileges:true"],
    }


def _probe_params(root: Path) -> dict[str, Any]:
    return {
        "user": "65534:65534",  # nobody: the probe needs no privilege
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "volumes": {str(root / PROBE_FILE): {"bind": PROBE_IN_CONTAINER, "mode": "ro"}},
    }


def probe_serve_params(root: Path, service: Container) -> dict[str, Any]:
    """The probe's peer, in the service's network namespace: RTT handshakes and the bulk sender."""
    return {
        "command": ["python", PROBE_IN_CONTAINER, "serve", "--port", str(PROBE_PORT)],
        "network_mode": f"container:{service.id}",
        **_probe_params(root),
    }


def probe_measure_params(
    root: Path, service_ip: str, profile: NetworkProfile, cpus: tuple[int, ...]
) -> dict[str, Any]:
    """The probe on k6's network and CPUs; the bulk transfer only for a profile with a rate."""
    rate_seconds = PROBE_RATE_SECONDS if profile.rate_bps else 0.0
    return {
        "command": [
            "python",
            PROBE_IN_CONTAINER,
            "measure",
            "--host",
            service_ip,
            "--port",
            str(PROBE_PORT),
            "--samples",
            str(PROBE_RTT_SAMPLES),
            "--rate-seconds",
            f"{rate_seconds:g}",
        ],
        "network": NETWORK,
        "cpuset_cpus": cpu_list(cpus),
        **_probe_params(root),
    }


def no_netem_message(profile: NetworkProfile) -> str:
    return (
        f"network {profile.name}: the Docker engine's kernel has no netem (sch_netem): "
        f'`tc qdisc ... netem` answers "{NO_NETEM}", and this profile\'s delay, jitter or loss '
        "need it. Use an engine whose kernel has sch_netem, or run it with --backend local, whose "
        "userspace link emulator works without netem; rate-only profiles work here (tbf)"
    )


def parse_probe(exit_code: int, output: str, profile: NetworkProfile) -> tuple[LinkMeasurement, str]:
    """The probe's JSON line as a LinkMeasurement (median RTT) and the probe's address."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    message: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        message = json.loads(lines[-1]) if lines else {}
    if exit_code != 0 or message.get("event") != "measured":
        why = message.get("error") or f"exit {exit_code}"
        failure = f"network {profile.name}: the link probe failed: {why}"
        raise ScenarioFailed("network", failure, tail(output.encode()))
    rtts = tuple(float(rtt) for rtt in message["rtt_s"])
    rate = message.get("rate_bps")
    measurement = LinkMeasurement(statistics.median(rtts), rtts, None if rate is None else float(rate))
    return measurement, str(message["address"])


def memory_peak_from_metrics(text: str) -> int | None:
    """protolab_cgroup_memory_peak_bytes from a /metrics page."""
    match = re.search(r"^protolab_cgroup_memory_peak_bytes (\S+)$", text, re.MULTILINE)
    return None if match is None else int(float(match[1]))


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
    ) -> None:
        """`client` runs the services; `load`, when k6 runs on other engines (one may be the
        service's), their engines in [hosts] order; empty: k6 beside the service on its network."""
        self._settings = settings
        self._client = client
        self._service_url = service_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        self._load = tuple(load)
        self._publish = settings.hosts.publish_address
        remote = [engine.name for engine in self._load if not engine.on_this_host]
        if remote and ipaddress.ip_address(self._publish).is_loopback:
            raise BackendUnavailable(
                f"load engine {remote[0]} is another host: k6 there would dial its own {self._publish}; "
                "set --publish-address (or [hosts] publish_address) to this host's address the load "
                "hosts reach, and start the lab with PUBLISH_ADDRESS set to it"
            )
        self._services: dict[str, _Service] = {}
        self._certs_adopted = False
        for what, lookup in (
            (f"network {NETWORK}", lambda: client.networks.get(NETWORK)),
            (f"volume {CERTS_VOLUME}", lambda: client.volumes.get(CERTS_VOLUME)),
        ):
            try:
                lookup()
            except NotFound:
                raise BackendUnavailable(
                    f"docker {what} not found: start the lab first (docker compose up -d), "
                    "or use --backend local"
                ) from None
        self._say = say
        self._helper_ready = False  # the network helper image is built once a run needs it
        info = client.info()
        self._cpus = int(info["NCPU"])
        self._memory = info.get("MemTotal")  # bytes; a profile limit not below it is noted
        self._load_cpus = {engine.name: int(engine.client.info()["NCPU"]) for engine in self._load}
        # The same variables docker-compose.yml reads, so the runner's containers match compose's.
        self._k6_image = os.environ.get("K6_IMAGE") or K6_IMAGE
        nofile = int(os.environ.get("SERVICE_NOFILE") or NOFILE)
        self._ulimits = [Ulimit(name="nofile", soft=nofile, hard=nofile)]
        for engine_client, where in self._clients():
            # A load engine may be shared: another run's k6 still running there stays.
            if removed := remove_leftovers(engine_client, running_too=not where):
                names = ", ".join(removed)
                say(f"docker: removed {len(removed)} container(s) of an interrupted run{where}: {names}")
        for engine_client, where in self._k6_clients():
            try:
                engine_client.images.get(self._k6_image)
            except ImageNotFound:
                # `docker compose up -d` skips k6 (profile "tools"), so its image may be missing.
                say(f"docker: pulling {self._k6_image}{where}")
                repository, _, tag = self._k6_image.rpartition(":")
                engine_client.images.pull(repository, tag=tag)

    @property
    def cpus_elsewhere(self) -> str | None:
        if self._load:
            names = ", ".join(engine.name for engine in self._load)
            return f"k6 runs on load engine(s) {names}, apart from the service: their CPUs are not read"
        if not self._service_url.startswith("unix://"):
            return f"the Docker engine at {self._service_url} is not this host: its CPUs cannot be read here"
        return None

    def check_k6_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        if self._load:
            names = ", ".join(engine.name for engine in self._load)
            slots = self._k6_slots(profile)
            where = f"the load engines {names} have {len(slots)} CPUs for k6 beside profile {profile.name}"
            problem = k6_instances_problem(k6_instances, len(slots), where)
        else:
            k6_cpus = split_cpus(range(self._cpus), profile.whole_cpus).k6
            where = f"the engine has {self._cpus} CPUs and profile {profile.name} takes {profile.whole_cpus}"
            problem = k6_instances_problem(k6_instances, len(k6_cpus), where)
        if problem:
            raise BackendUnavailable(problem)

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
        with _docker_errors("start"):
            port, metrics_port = self._image_ports(image)
        split = split_cpus(range(self._cpus), profile.whole_cpus)
        notes: list[str] = []
        if split.shared and not self._load:
            notes.append(shared_cpus_note(split.k6, f"the Docker engine has {self._cpus} CPUs", profile))
        if self._memory is not None and profile.memory_bytes >= self._memory:
            notes.append(
                f"profile {profile.name}'s memory limit ({profile.memory_bytes // 2**20} MiB) is not below "
                f"the engine's memory ({self._memory // 2**20} MiB): it does not bind"
            )
        name = container_name(self._settings.run_id, scenario.id)
        env = {"HOST": "0.0.0.0", "PORT": str(port), "METRICS_PORT": str(metrics_port)}
        if target.tls:
            env["TLS_CERT_FILE"] = f"{CERTS_DIR}/{certs.SERVER_FILE}"
            env["TLS_KEY_FILE"] = f"{CERTS_DIR}/{certs.SERVER_KEY_FILE}"
        container = self._create(
            "start",
            image=image,
            command=["python", "-m", f"services.{target.service}"],
            name=name,
            environment=env | service_env(scenario),
            network=NETWORK,
            # The runner checks health and verifies from the host through these ports (None: any
            # free host port).
            ports={f"{port}/tcp": (self._publish, None), f"{metrics_port}/tcp": (self._publish, None)},
            nano_cpus=round(profile.cpus * 1e9),
            mem_limit=profile.memory_bytes,
            memswap_limit=profile.memory_bytes,  # equal to the limit: no swap
            cpuset_cpus=cpu_list(split.service),
            labels=self._labels(scenario, "service"),
            volumes={CERTS_VOLUME: {"bind": CERTS_DIR, "mode": "ro"}},
            ulimits=self._ulimits,
            # The runner checks health itself; the image's check would spend the CPU budget
            # every 30 s while k6 measures.
            healthcheck={"test": ["NONE"]},
            **SERVICE_HARDENING,
        )
        service = _Service(scenario, container, compose_name(target.service))
        self._services[scenario.id] = service
        network: dict[str, Any] | None = None
        try:
            with _docker_errors("start"):
                if target.tls and not self._certs_adopted:
                    notes += self._adopt_certs(container)
                container.start()
                listening = self._await_listening(service)
                container.reload()
                host_port = _published_port(container, port, self._publish)
                published_metrics = listening.get("metrics_port") or None
                host_metrics_port = (
                    _published_port(container, metrics_port, self._publish) if published_metrics else None
                )
                service.ip = container.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
            if scenario.network.emulated:
                network = self._network(service, split.k6)
        except BaseException:
            self._release(scenario.id)  # no handle reaches the runner, so remove it here
            raise
        published = Endpoint(self._publish, host_port)
        if self._load:  # k6 elsewhere dials the published port; the certificate names the address
            slots = self._k6_slots(profile)
            k6_address, k6_cpus = published, tuple(range(len(slots)))
            k6_places = tuple(f"engine {engine.name} CPU {cpu}" for engine, cpu in slots)
            engines = ", ".join(engine.name for engine in self._load)
            path = f"k6 on engine(s) {engines} (host network) to {published}, the service's published port"
        else:
            # The compose name, mapped to this container in k6's /etc/hosts: the certificate
            # has a SAN for it, not for the per-scenario container name.
            k6_address, k6_cpus, k6_places = Endpoint(service.hostname, port), split.k6, ()
            path = f"docker bridge network {NETWORK}: k6 container to service container"
        return ServiceHandle(
            scenario_id=scenario.id,
            service=target.service,
            address=published,
            k6_address=k6_address,
            metrics_address=Endpoint(self._publish, host_metrics_port) if host_metrics_port else None,
            prometheus_target=f"{name}:{metrics_port}" if published_metrics else None,
            workers=listening.get("workers"),
            limits="docker",
            service_cpus=split.service,
            k6_cpus=k6_cpus,
            notes=tuple(notes),
            network=network,
            network_path=path,
            interpreter=listening.get("interpreter"),
            k6_places=k6_places,
        )

    def service_ended(self, handle: ServiceHandle) -> str | None:
        container = self._services[handle.scenario_id].container
        with _docker_errors("health"):
            container.reload()
        if container.status == "running":
            return None
        return f"{container.status} (exit code {container.attrs['State'].get('ExitCode')})"

    def service_log_tail(self, handle: ServiceHandle) -> str:
        return _logs_tail(self._services[handle.scenario_id].container)

    def run_k6(self, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Process:
        return self.run_k6_instances(handle, [invocation], measured)[0]

    def run_k6_instances(
        self, handle: ServiceHandle, invocations: Sequence[K6Invocation], measured: bool
    ) -> tuple[K6Process, ...]:
        """One k6 container per invocation, started together, each on its own cpuset; on other
        engines, k6's files go in and its summary and raw samples come out through the engine's API
        (a bind mount would name a directory of the engine's host, not of this one)."""
        service = self._services[handle.scenario_id]
        phase = "measure" if measured else "warmup"
        runs: list[tuple[K6Invocation, Container, int, str | None]] = []
        try:
            for index, invocation in enumerate(invocations, start=1):
                client, cpus, place = self._k6_place(handle, invocation)
                suffix = "" if len(invocations) == 1 else f"-{index}"
                name = f"{service.container.name}-k6{suffix}"
                params = self._k6_params(service, invocation, phase, cpus, name)
                container = self._create(phase, client, **params)
                runs.append((invocation, container, len(cpus), place))
                if self._load:
                    with _docker_errors(phase):
                        container.put_archive("/", self._k6_files())
            with _docker_errors(phase):
                before = _stats(service.container) if measured else None
                started = time.monotonic()
                for _, container, _, _ in runs:
                    container.start()
                cpu_ns = _cpu_until_all_exit([container for _, container, _, _ in runs])
                wall = time.monotonic() - started
                if before is not None:
                    after = _stats(service.container)
                    # Without a peak in the stats (cgroup v2), ask the service for its cgroup's.
                    peak = self._memory_peak(handle) if after.memory_max_usage is None else None
                    service.window = UsageWindow(before, after, wall, peak)
                processes = []
                for (invocation, container, cpu_count, place), cpu in zip(runs, cpu_ns, strict=True):
                    exit_code = int(container.wait()["StatusCode"])
                    output = container.logs(stdout=True, stderr=True)
                    if self._load:
                        _copy_results(container, invocation)
                    invocation.log_file.parent.mkdir(parents=True, exist_ok=True)
                    with invocation.log_file.open("ab") as log:
                        log.write(output)
                    processes.append(
                        K6Process(
                            exit_code=exit_code,
                            wall_seconds=wall,
                            cpu_seconds=None if cpu is None else cpu / 1e9,
                            cpus=cpu_count,
                            output_tail=tail(output),
                            placement=place,
                        )
                    )
        finally:
            for _, container, _, _ in runs:
                _remove(container)  # also on Ctrl-C: force stops k6
        return tuple(processes)

    def stop_service(self, handle: ServiceHandle) -> ServiceUsage:
        released = self._release(handle.scenario_id)
        if released is None:
            return ServiceUsage.unmeasured(None, "")
        service, exit_code, log_tail = released
        return usage_from_stats(service.window, service.scenario.profile.cpus, exit_code, log_tail)

    def close(self) -> None:
        for scenario_id in list(self._services):
            self._release(scenario_id)
        # A create interrupted by Ctrl-C may still have made its container: none of this run's stays.
        for client, _ in self._clients():
            with contextlib.suppress(DockerException):
                for container in client.containers.list(
                    all=True, filters={"label": f"protolab.run={self._settings.run_id}"}
                ):
                    _remove(container)

    def _clients(self) -> list[tuple[docker.DockerClient, str]]:
        """Each engine's client once, with " on engine <name>" for messages ("" for the service's)."""
        others = [engine for engine in self._load if engine.client is not self._client]
        return [(self._client, ""), *((engine.client, f" on engine {engine.name}") for engine in others)]

    def _k6_clients(self) -> list[tuple[docker.DockerClient, str]]:
        """The clients of the engines that run k6: the load engines, else the service's."""
        return [(engine.client, f" on engine {engine.name}") for engine in self._load] or [(self._client, "")]

    def _k6_slots(self, profile: Profile) -> list[tuple[Engine, int]]:
        """The load engines' CPUs for k6, one engine after another in turn (two instances on two
        engines take one each); an engine that also runs the service offers what the service leaves."""
        per_engine = []
        for engine in self._load:
            if engine.client is self._client:  # what the service leaves; nothing when they would share
                split = split_cpus(range(self._cpus), profile.whole_cpus)
                cpus: Sequence[int] = () if split.shared else split.k6
            else:
                cpus = range(self._load_cpus[engine.name])
            per_engine.append([(engine, cpu) for cpu in cpus])
        return [slot for turn in itertools.zip_longest(*per_engine) for slot in turn if slot is not None]

    def _k6_place(
        self, handle: ServiceHandle, invocation: K6Invocation
    ) -> tuple[docker.DockerClient, tuple[int, ...], str | None]:
        """The engine, cpuset and description of one k6 container."""
        if not self._load:
            return self._client, invocation.cpus or handle.k6_cpus, None
        slots = self._k6_slots(self._services[handle.scenario_id].scenario.profile)
        if invocation.cpus is None:  # one k6: every CPU the first load engine offers
            engine = slots[0][0]
            cpus = tuple(cpu for slot_engine, cpu in slots if slot_engine is engine)
            return engine.client, cpus, f"engine {engine.name} CPUs {cpu_list(cpus)}"
        (index,) = invocation.cpus
        engine, cpu = slots[index]
        return engine.client, (cpu,), f"engine {engine.name} CPU {cpu}"

    def _k6_files(self) -> bytes:
        """What k6 on another engine reads (k6/, proto/, the lab CA) and a results directory it can
        write, as a tar for put_archive at the container's root."""
        buffer = io.BytesIO()
        root = self._settings.root
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for directory, inside in ((root / "k6", K6_DIR), (root / "proto", PROTO_DIR)):
                tar.add(directory, arcname=inside.lstrip("/"), filter=_readable)
            ca = self._settings.certs_dir / certs.CA_FILE
            if ca.exists():
                tar.add(ca, arcname=f"{CERTS_DIR.lstrip('/')}/{certs.CA_FILE}", filter=_readable)
            results = tarfile.TarInfo(RESULTS_DIR.lstrip("/"))
            results.type, results.mode = tarfile.DIRTYPE, 0o1777  # k6's image runs as its own user
            tar.addfile(results)
        return buffer.getvalue()

    def _network(self, service: _Service, probe_cpus: tuple[int, ...]) -> dict[str, Any]:
        """Emulate the profile on the service container's link, verify it, and say what was measured.

        Any failure is the scenario's, in phase "network"; the helpers are gone when this returns.
        """
        profile = service.scenario.network
        self._ensure_network_helper()
        emulator = emulator_name(profile)
        params = tc_helper_params(profile, service.container)
        exit_code, output = self._run_helper(service, "tc", params)
        if exit_code != 0:
            if NO_NETEM in output and emulator == "netem":
                raise ScenarioFailed("network", no_netem_message(profile), tail(output.encode()))
            raise ScenarioFailed(
                "network",
                f"network {profile.name}: tc in the service's network namespace failed (exit {exit_code})",
                tail(output.encode()),
            )
        measurement, client_address = self._verify_link(service, probe_cpus)
        if problems := measurement.problems(profile):
            raise ScenarioFailed("network", f"network {profile.name}: " + "; ".join(problems))
        return {
            "emulator": emulator,
            "service_address": service.ip,
            "client_address": client_address,  # the probe's, on k6's network
            "measured_rtt_s": measurement.rtt_s,
            "measured_rate_bps": measurement.rate_bps,
        }

    def _verify_link(self, service: _Service, cpus: tuple[int, ...]) -> tuple[LinkMeasurement, str]:
        """RTT (and for a rate, a bulk transfer) from a probe on k6's network, on k6's CPUs, to a
        peer in the service's namespace: the path k6's requests take."""
        profile = service.scenario.network
        serve = self._helper(
            service, "link-serve", **probe_serve_params(self._settings.root, service.container)
        )
        try:
            with _docker_errors("network"):
                serve.start()
            params = probe_measure_params(self._settings.root, service.ip, profile, cpus)
            exit_code, output = self._run_helper(service, "link-probe", params)
        finally:
            _remove(serve)
        return parse_probe(exit_code, output, profile)

    def _helper(self, service: _Service, kind: str, **params: Any) -> Container:
        return self._create(
            "network",
            image=NETWORK_HELPER_IMAGE,
            name=f"{service.container.name}-{kind}",
            labels=self._labels(service.scenario, "network"),
            **params,
        )

    def _run_helper(self, service: _Service, kind: str, params: Mapping[str, Any]) -> tuple[int, str]:
        """Run a helper to its end: its exit code and output; it is removed in any case."""
        container = self._helper(service, kind, **params)
        try:
            with _docker_errors("network"):
                container.start()
                try:
                    exit_code = int(container.wait(timeout=_HELPER_TIMEOUT_S)["StatusCode"])
                except RequestException:
                    raise ScenarioFailed(
                        "network", f"the network helper {kind} did not finish in {_HELPER_TIMEOUT_S} s"
                    ) from None
                output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        finally:
            _remove(container)
        return exit_code, output

    def _ensure_network_helper(self) -> None:
        """Build the helper image when it is missing or was built from another Dockerfile or base."""
        if self._helper_ready:
            return
        base = os.environ.get("PYTHON_IMAGE") or PYTHON_IMAGE
        context = self._settings.root / NETWORK_HELPER_DIR
        base_id = ""  # a base the engine lacks is pulled by the build
        with _docker_errors("network"), contextlib.suppress(ImageNotFound):
            base_id = str(self._client.images.get(base).id)
        inputs = helper_inputs((context / "Dockerfile").read_bytes(), base, base_id)
        with _docker_errors("network"), contextlib.suppress(ImageNotFound):
            labels = self._client.images.get(NETWORK_HELPER_IMAGE).attrs["Config"].get("Labels") or {}
            self._helper_ready = labels.get(INPUTS_LABEL) == inputs
        if self._helper_ready:
            return
        self._say(f"docker: building {NETWORK_HELPER_IMAGE} from {base} (iproute2, for tc)")
        try:
            with _docker_errors("network"):
                self._client.images.build(
                    path=str(context),
                    tag=NETWORK_HELPER_IMAGE,
                    # As compose does for services/Dockerfile: the build arg only when it is set.
                    buildargs={"PYTHON_IMAGE": base} if os.environ.get("PYTHON_IMAGE") else {},
                    labels={INPUTS_LABEL: inputs},
                    rm=True,
                )
        except BuildError as exc:
            log = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)
            raise ScenarioFailed(
                "network", f"building {NETWORK_HELPER_IMAGE} failed: {exc.msg}", tail(log.encode())
            ) from exc
        self._helper_ready = True

    def _create(self, phase: str, client: docker.DockerClient | None = None, **params: Any) -> Container:
        """containers.create on client (default: the service's engine); when it is interrupted,
        whatever the engine made under that name goes."""
        engine = client or self._client
        try:
            with _docker_errors(phase):
                return engine.containers.create(**params)
        except BaseException:
            with contextlib.suppress(DockerException):
                _remove(engine.containers.get(params["name"]))
            raise

    def _release(self, scenario_id: str) -> tuple[_Service, int, str] | None:
        """Stop the service (SIGTERM, then SIGKILL), keep its log, remove it; None when not running."""
        service = self._services.pop(scenario_id, None)
        if service is None:
            return None
        container = service.container
        try:
            with _docker_errors("stop"):
                container.stop(timeout=math.ceil(self._settings.stop_timeout_s))
                exit_code = int(container.wait()["StatusCode"])
                output = container.logs(stdout=True, stderr=True)
        finally:
            _remove(container)
        log_file = self._settings.logs_dir / f"{scenario_id}.service.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            log.write(output)
        return service, exit_code, tail(output)

    def _labels(self, scenario: Scenario, role: str) -> dict[str, str]:
        return {
            MANAGED_LABEL: "true",
            "protolab.run": self._settings.run_id,
            "protolab.scenario": scenario.id,
            "protolab.target": scenario.target.name,
            "protolab.profile": scenario.profile.name,
            "protolab.role": role,
        }

    def _image_ports(self, image: str) -> tuple[int, int]:
        """PORT and METRICS_PORT as the image was built with them (compose build args)."""
        try:
            config = self._client.images.get(image).attrs["Config"]
        except ImageNotFound:
            raise ScenarioFailed(
                "start", f"image {image} not found: build it with `docker compose --profile services build`"
            ) from None
        env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
        try:
            return int(env["PORT"]), int(env["METRICS_PORT"])
        except (KeyError, ValueError):
            raise ScenarioFailed("start", f"image {image} sets no PORT and METRICS_PORT") from None

    def _adopt_certs(self, container: Container) -> list[str]:
        """Copy the certs volume's TLS material into --certs, so the runner trusts the containers' CA.

        The services present the certificate compose's one-shot `certs` service wrote into the
        volume; the runner verifies them from the host against <certs>/ca.pem, so that file must
        come from the same CA. The keys come along so the directory stays one valid set.
        """
        stream, _ = container.get_archive(CERTS_DIR)
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                data = tar.extractfile(member) if name in _CERT_MODES else None
                if data is not None:
                    files[name] = data.read()
        if certs.CA_FILE not in files:
            raise ScenarioFailed(
                "start", f"volume {CERTS_VOLUME} holds no {certs.CA_FILE}: run `docker compose up -d`"
            )
        directory = self._settings.certs_dir
        changed = sorted(n for n, data in files.items() if _read_bytes(directory / n) != data)
        for file_name in changed:
            certs.write_file(directory / file_name, files[file_name], _CERT_MODES[file_name])
        # Every lab certificate names 127.0.0.1; another address, only when compose's `certs` had it.
        if self._publish not in certs.IP_ADDRESSES and self._publish not in certs.server_names(directory):
            raise ScenarioFailed(
                "start",
                f"the certificate in volume {CERTS_VOLUME} does not name the publish address "
                f"{self._publish}, which k6 dials: recreate it with "
                f"`PUBLISH_ADDRESS={self._publish} docker compose up -d`",
            )
        self._certs_adopted = True  # after the check: every TLS scenario fails the same way
        if not changed:
            return []
        return [f"copied {', '.join(changed)} from volume {CERTS_VOLUME} into {directory} (the services' CA)"]

    def _await_listening(self, service: _Service) -> dict[str, Any]:
        """The service's listening line: its workers, and whether metrics and TLS are on."""
        timeout = self._settings.start_timeout_s
        deadline = time.monotonic() + timeout
        while not (listening := _listening(service.container)):
            self._check_running(service, "start")
            if time.monotonic() > deadline:
                raise ScenarioFailed(
                    "start", f"no listening line in {timeout:g}s", _logs_tail(service.container)
                )
            time.sleep(_POLL_S)
        check_listening(listening, service.scenario, _logs_tail(service.container))
        return listening

    def _check_running(self, service: _Service, phase: str) -> None:
        container = service.container
        container.reload()
        if container.status != "running":
            code = container.attrs["State"].get("ExitCode")
            module = f"services.{service.scenario.target.service}"
            raise ScenarioFailed(
                phase, f"{module} {container.status} (exit code {code})", _logs_tail(container)
            )

    def _k6_params(
        self, service: _Service, invocation: K6Invocation, phase: str, cpus: Sequence[int], name: str
    ) -> dict[str, Any]:
        """A k6 container: the invocation with host paths moved to where the container has them.

        Beside the service: on the compose network, the files mounted. On another engine: on that
        host's network (no bridge or NAT between k6 and the wire), the files copied in (_k6_files).
        """
        root = self._settings.root
        results = invocation.summary_file.parent
        paths = {
            root / "k6": K6_DIR,
            root / "proto": PROTO_DIR,
            self._settings.certs_dir: CERTS_DIR,  # the volume: the same CA after _adopt_certs
            results: RESULTS_DIR,
        }
        script = _in_container(str(invocation.script), paths)
        if not script.startswith(f"{K6_DIR}/"):
            raise ScenarioFailed(phase, f"k6 script {invocation.script} is not under {root / 'k6'}")
        args = [_csv_in_container(arg, paths) for arg in invocation.args]
        # InfluxDB on this host's loopback: the compose service beside the service, else this
        # host's publish address, on the URL's port (k6 on another host has its own loopback).
        if self._load:
            args = [_influxdb_at(arg, self._publish) for arg in args]
        else:
            args = [_influxdb_at(arg, *INFLUXDB_IN_NETWORK.split(":")) for arg in args]
        params: dict[str, Any] = {
            "image": self._k6_image,
            "command": ["run", *args, script],
            "name": name,
            "environment": {key: _in_container(value, paths) for key, value in invocation.env.items()},
            "cpuset_cpus": cpu_list(cpus),
            "labels": self._labels(service.scenario, "k6"),
            "ulimits": self._ulimits,
        }
        if self._load:
            return params | {"network_mode": "host"}
        return params | {
            "network": NETWORK,
            "extra_hosts": {service.hostname: service.ip},
            # The host's user, so k6 can write its summary into the results directory it mounts.
            "user": f"{os.getuid()}:{os.getgid()}",
            "volumes": {
                str(root / "k6"): {"bind": K6_DIR, "mode": "ro"},
                str(root / "proto"): {"bind": PROTO_DIR, "mode": "ro"},
                CERTS_VOLUME: {"bind": CERTS_DIR, "mode": "ro"},
                str(results): {"bind": RESULTS_DIR, "mode": "rw"},
            },
        }

    def _memory_peak(self, handle: ServiceHandle) -> int | None:
        if handle.metrics_address is None:
            return None
        try:
            response = httpx.get(f"http://{handle.metrics_address}/metrics", timeout=_METRICS_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return memory_peak_from_metrics(response.text) if response.status_code == 200 else None


@contextlib.contextmanager
def _docker_errors(phase: str) -> Iterator[None]:
    """An engine error ends the scenario with the engine's own explanation."""
    try:
        yield
    except DockerException as exc:
        raise ScenarioFailed(phase, f"docker: {exc}") from exc


def _stats(container: Container) -> StatsSnapshot:
    # one_shot: the current counters now, instead of waiting a second for a CPU percentage.
    # stream=False returns the one decoded sample; the stubs give both modes one return type.
    return StatsSnapshot.parse(cast("dict[str, Any]", container.stats(stream=False, one_shot=True)))


def _cpu_until_all_exit(containers: Sequence[Container]) -> list[int | None]:
    """Each k6 container's CPU nanoseconds: an exited container has no stats, so sample until it exits.

    The last sample is at most one poll interval (times the containers) before the exit, so up to
    that much k6 CPU goes uncounted; a stopped container reports zero, hence the maximum.
    """
    cpu_ns: list[int | None] = [None] * len(containers)
    running = list(range(len(containers)))
    while running:
        for index in list(running):
            container = containers[index]
            if sample := _stats(container).cpu_ns:
                cpu_ns[index] = max(cpu_ns[index] or 0, sample)
            container.reload()
            if container.status != "running":
                running.remove(index)
        if running:
            time.sleep(_K6_POLL_S)
    return cpu_ns


def _copy_results(container: Container, invocation: K6Invocation) -> None:
    """k6's summary and raw samples out of its container into the host paths the runner reads;
    a file k6 did not write stays missing (the runner then reports the missing summary)."""
    for path in (invocation.summary_file, invocation.raw_file):
        if path is None:
            continue
        try:
            stream, _ = container.get_archive(f"{RESULTS_DIR}/{path.name}")
        except NotFound:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        archive = path.with_name(path.name + ".tar")  # on disk: raw samples can be gigabytes
        try:
            with archive.open("wb") as file:
                for chunk in stream:
                    file.write(chunk)
            with tarfile.open(archive) as tar, path.open("wb") as out:
                member = tar.extractfile(path.name)
                if member is not None:
                    shutil.copyfileobj(member, out)
        finally:
            archive.unlink(missing_ok=True)


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files for k6's container: readable by its user, no bytecode caches."""
    if "__pycache__" in info.name:
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def _remove(container: Container) -> None:
    with contextlib.suppress(NotFound):
        container.remove(force=True)


def _published_port(container: Container, port: int, address: str) -> int:
    for binding in container.ports.get(f"{port}/tcp") or []:
        if binding.get("HostIp") == address:
            return int(binding["HostPort"])
    raise ScenarioFailed("start", f"port {port} of {container.name} is not published on {address}")


def _in_container(value: str, paths: Mapping[Path, str]) -> str:
    """A host path under a mounted directory, as the container sees it; anything else unchanged."""
    for host, inside in paths.items():
        if value == str(host) or value.startswith(f"{host}/"):
            return inside + value[len(str(host)) :]
    return value


def _csv_in_container(arg: str, paths: Mapping[Path, str]) -> str:
    """A k6 CSV output (an instance's raw samples) written where the container has the results."""
    if not arg.startswith("csv="):
        return arg
    return "csv=" + _in_container(arg.removeprefix("csv="), paths)


def _influxdb_at(arg: str, host: str, port: str | None = None) -> str:
    """A k6 InfluxDB output on this host's loopback, moved to host (and port, else the URL's) as
    k6 reaches it."""
    if not arg.startswith("influxdb="):
        return arg
    url = urlsplit(arg.removeprefix("influxdb="))
    if url.hostname not in _LOOPBACK_NAMES:
        return arg
    netloc = f"{host}:{port or url.port}" if port or url.port else host
    return "influxdb=" + urlunsplit(url._replace(netloc=netloc))


def _listening(container: Container) -> dict[str, Any]:
    return listening_event(container.logs(stdout=True, stderr=False).splitlines())


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _logs_tail(container: Container) -> str:
    with contextlib.suppress(DockerException):
        return tail(container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES))
    return ""
