"""k6's containers on the docker backend: on which engine and CPUs each runs, how it reaches the
service, and its files as the container sees them."""

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import docker
from docker.types import Ulimit

from labrunner.backends.base import (
    BackendSettings,
    BackendUnavailable,
    Endpoint,
    K6Invocation,
    ScenarioFailed,
    ServiceHandle,
    cpu_list,
    k6_instances_problem,
)
from labrunner.backends.cgroups import split_cpus
from labrunner.backends.docker.names import (
    CERTS_DIR,
    CERTS_VOLUME,
    INFLUXDB_IN_NETWORK,
    K6_DIR,
    NETWORK,
    PROTO_DIR,
    RESULTS_DIR,
    labels,
    shape_mount,
)
from labrunner.backends.docker.preflight import EngineClients
from labrunner.backends.docker.services import ServiceContainer
from labrunner.backends.engines import Engine
from labrunner.model.scenario import K6Instances, Profile

_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class K6Route:
    """How k6 reaches a service, on which CPUs, and the path its requests take."""

    address: Endpoint
    cpus: tuple[int, ...]
    places: tuple[str, ...]  # per instance on load engines: "engine <name> CPU <n>"; empty beside
    path: str


@dataclass(frozen=True)
class K6Containers:
    """k6 beside the service on its engine (load empty), or on the load engines [hosts] names."""

    settings: BackendSettings
    client: docker.DockerClient  # the service's engine
    engine_cpus: int  # the service's engine's CPUs
    load: tuple[Engine, ...]
    load_cpus: Mapping[str, int]  # each load engine's CPUs, by name
    image: str
    ulimits: list[Ulimit]

    def clients(self) -> EngineClients:
        """The clients of the engines that run k6: the load engines, else the service's."""
        return [(engine.client, f" on engine {engine.name}") for engine in self.load] or [(self.client, "")]

    def check_instances(self, profile: Profile, k6_instances: K6Instances) -> None:
        if self.load:
            names = ", ".join(engine.name for engine in self.load)
            slots = self.slots(profile)
            where = f"the load engines {names} have {len(slots)} CPUs for k6 beside profile {profile.name}"
            problem = k6_instances_problem(k6_instances, len(slots), where)
        else:
            k6_cpus = split_cpus(range(self.engine_cpus), profile.whole_cpus).k6
            where = (
                f"the engine has {self.engine_cpus} CPUs and profile {profile.name} "
                f"takes {profile.whole_cpus}"
            )
            problem = k6_instances_problem(k6_instances, len(k6_cpus), where)
        if problem:
            raise BackendUnavailable(problem)

    def slots(self, profile: Profile) -> list[tuple[Engine, int]]:
        """The load engines' CPUs for k6, one engine after another in turn (two instances on two
        engines take one each); an engine that also runs the service offers what the service leaves."""
        per_engine = []
        for engine in self.load:
            if engine.client is self.client:  # what the service leaves; nothing when they would share
                split = split_cpus(range(self.engine_cpus), profile.whole_cpus)
                cpus: Sequence[int] = () if split.shared else split.k6
            else:
                cpus = range(self.load_cpus[engine.name])
            per_engine.append([(engine, cpu) for cpu in cpus])
        return [slot for turn in itertools.zip_longest(*per_engine) for slot in turn if slot is not None]

    def route(
        self, service: ServiceContainer, port: int, published: Endpoint, beside: tuple[int, ...]
    ) -> K6Route:
        """k6's way to the service: its published port from the load engines, else the compose
        network from beside it, on the CPUs the service leaves (beside)."""
        if self.load:  # k6 elsewhere dials the published port; the certificate names the address
            slots = self.slots(service.scenario.profile)
            engines = ", ".join(engine.name for engine in self.load)
            return K6Route(
                published,
                tuple(range(len(slots))),
                tuple(f"engine {engine.name} CPU {cpu}" for engine, cpu in slots),
                f"k6 on engine(s) {engines} (host network) to {published}, the service's published port",
            )
        # The compose name, mapped to this container in k6's /etc/hosts: the certificate
        # has a SAN for it, not for the per-scenario container name.
        return K6Route(
            Endpoint(service.hostname, port),
            beside,
            (),
            f"docker bridge network {NETWORK}: k6 container to service container",
        )

    def place(
        self, handle: ServiceHandle, profile: Profile, invocation: K6Invocation
    ) -> tuple[docker.DockerClient, tuple[int, ...], str | None]:
        """The engine, cpuset and description of one k6 container."""
        if not self.load:
            return self.client, invocation.cpus or handle.k6_cpus, None
        slots = self.slots(profile)
        if invocation.cpus is None:  # one k6: every CPU the first load engine offers
            engine = slots[0][0]
            cpus = tuple(cpu for slot_engine, cpu in slots if slot_engine is engine)
            return engine.client, cpus, f"engine {engine.name} CPUs {cpu_list(cpus)}"
        (index,) = invocation.cpus
        engine, cpu = slots[index]
        return engine.client, (cpu,), f"engine {engine.name} CPU {cpu}"

    def params(
        self, service: ServiceContainer, invocation: K6Invocation, phase: str, cpus: Sequence[int], name: str
    ) -> dict[str, Any]:
        """A k6 container: the invocation with host paths moved to where the container has them.

        Beside the service: on the compose network, the files mounted. On another engine: on that
        host's network (no bridge or NAT between k6 and the wire), the files copied in
        (archives.k6_files).
        """
        root = self.settings.root
        results = invocation.summary_file.parent
        paths = {
            root / "k6": K6_DIR,
            root / "proto": PROTO_DIR,
            self.settings.certs_dir: CERTS_DIR,  # the volume: the same CA after adopt_certs
            results: RESULTS_DIR,
            **shape_mount(),  # the user's message's descriptor set (PROTOSET)
        }
        script = _in_container(str(invocation.script), paths)
        if not script.startswith(f"{K6_DIR}/"):
            raise ScenarioFailed(phase, f"k6 script {invocation.script} is not under {root / 'k6'}")
        args = [_csv_in_container(arg, paths) for arg in invocation.args]
        # InfluxDB on this host's loopback: the compose service beside the service, else this
        # host's publish address, on the URL's port (k6 on another host has its own loopback).
        if self.load:
            args = [_influxdb_at(arg, self.settings.hosts.publish_address) for arg in args]
        else:
            args = [_influxdb_at(arg, *INFLUXDB_IN_NETWORK.split(":")) for arg in args]
        params: dict[str, Any] = {
            "image": self.image,
            "command": ["run", *args, script],
            "name": name,
            "environment": {key: _in_container(value, paths) for key, value in invocation.env.items()},
            "cpuset_cpus": cpu_list(cpus),
            "labels": labels(self.settings.run_id, service.scenario, "k6"),
            "ulimits": self.ulimits,
        }
        if self.load:
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
                **{str(host): {"bind": inside, "mode": "ro"} for host, inside in shape_mount().items()},
            },
        }


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
