"""Service containers: a scenario's service from its compose-built image under the profile's
limits, waited for until it listens, stopped with its log kept."""

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import ImageNotFound
from docker.models.containers import Container
from docker.types import Ulimit

from labrunner import certs
from labrunner.backends.base import (
    BackendSettings,
    ScenarioFailed,
    check_listening,
    cpu_list,
    listening_event,
    service_env,
    tail,
)
from labrunner.backends.cgroups import CFS_PERIOD_US, quota_us
from labrunner.backends.docker.containers import docker_errors, logs_tail, remove
from labrunner.backends.docker.names import (
    CERTS_DIR,
    CERTS_VOLUME,
    NETWORK,
    SERVICE_HARDENING,
    SHAPE_DIR,
    labels,
    shape_mount,
)
from labrunner.backends.docker.stats import UsageWindow
from labrunner.model.scenario import Scenario

_POLL_S = 0.2


@dataclass
class ServiceContainer:
    """Mutable state of one service container, private to the docker backend."""

    scenario: Scenario
    container: Container
    hostname: str  # the compose service name k6 dials: the certificate's SAN
    port: int = 0  # the port the service listens on in its container
    ip: str = ""
    window: UsageWindow | None = None


def image_ports(client: docker.DockerClient, image: str) -> tuple[int, int]:
    """PORT and METRICS_PORT as the image was built with them (compose build args)."""
    try:
        config = client.images.get(image).attrs["Config"]
    except ImageNotFound:
        raise ScenarioFailed(
            "start", f"image {image} not found: build it with `docker compose --profile services build`"
        ) from None
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    try:
        return int(env["PORT"]), int(env["METRICS_PORT"])
    except (KeyError, ValueError):
        raise ScenarioFailed("start", f"image {image} sets no PORT and METRICS_PORT") from None


def service_params(
    settings: BackendSettings,
    scenario: Scenario,
    *,
    image: str,
    name: str,
    ports: tuple[int, int],
    cpus: tuple[int, ...],
    ulimits: list[Ulimit],
) -> dict[str, Any]:
    """The service's container: every limit of its profile, the compose service's hardening, its
    ports published on the publish address."""
    profile, target = scenario.profile, scenario.target
    port, metrics_port = ports
    publish = settings.hosts.publish_address
    shape = shape_mount() if "SHAPE_DIR" in service_env(scenario) else {}
    env = {"HOST": "0.0.0.0", "PORT": str(port), "METRICS_PORT": str(metrics_port)}
    if target.tls:
        env["TLS_CERT_FILE"] = f"{CERTS_DIR}/{certs.SERVER_FILE}"
        env["TLS_KEY_FILE"] = f"{CERTS_DIR}/{certs.SERVER_KEY_FILE}"
    return {
        "image": image,
        "command": ["python", "-m", target.main_module],
        "name": name,
        # SHAPE_DIR as the container sees it (the user's message: names.shape_mount).
        "environment": env | service_env(scenario) | ({"SHAPE_DIR": SHAPE_DIR} if shape else {}),
        "network": NETWORK,
        # The runner checks health and verifies from the host through these ports (None: any
        # free host port).
        "ports": {f"{port}/tcp": (publish, None), f"{metrics_port}/tcp": (publish, None)},
        # The whole CPUs' quota until the service listens, then the profile's (apply_profile_quota),
        # as on the local backend: importing its modules is no part of what a profile limits.
        # A period and quota, not nano_cpus: an engine refuses to update the quota of a container
        # created with nano_cpus.
        "cpu_period": CFS_PERIOD_US,
        "cpu_quota": quota_us(profile.whole_cpus),
        "mem_limit": profile.memory_bytes,
        "memswap_limit": profile.memory_bytes,  # equal to the limit: no swap
        "cpuset_cpus": cpu_list(cpus),
        "labels": labels(settings.run_id, scenario, "service"),
        "volumes": {
            CERTS_VOLUME: {"bind": CERTS_DIR, "mode": "ro"},
            **{str(host): {"bind": inside, "mode": "ro"} for host, inside in shape.items()},
        },
        "ulimits": ulimits,
        # The runner checks health itself; the image's check would spend the CPU budget
        # every 30 s while k6 measures.
        "healthcheck": {"test": ["NONE"]},
        **SERVICE_HARDENING,
    }


def await_listening(service: ServiceContainer, timeout: float) -> dict[str, Any]:
    """The service's listening line: its workers, and whether metrics and TLS are on."""
    deadline = time.monotonic() + timeout
    while not (listening := _listening(service.container)):
        check_running(service, "start")
        if time.monotonic() > deadline:
            raise ScenarioFailed("start", f"no listening line in {timeout:g}s", logs_tail(service.container))
        time.sleep(_POLL_S)
    check_listening(listening, service.scenario, logs_tail(service.container))
    return listening


def apply_profile_quota(service: ServiceContainer) -> None:
    """Lower the listening service's CPU quota to its profile's and check the engine holds it."""
    container, profile = service.container, service.scenario.profile
    want = quota_us(profile.cpus)
    container.update(cpu_quota=want)
    container.reload()
    host = container.attrs["HostConfig"]
    held = (host.get("CpuPeriod"), host.get("CpuQuota"))
    if held != (CFS_PERIOD_US, want):
        raise ScenarioFailed(
            "start",
            f"profile {profile.name}: the engine holds CPU period/quota {held[0]}/{held[1]} us, "
            f"not {CFS_PERIOD_US}/{want}",
        )


def check_running(service: ServiceContainer, phase: str) -> None:
    container = service.container
    container.reload()
    if container.status != "running":
        code = container.attrs["State"].get("ExitCode")
        module = service.scenario.target.main_module
        raise ScenarioFailed(phase, f"{module} {container.status} (exit code {code})", logs_tail(container))


def published_port(container: Container, port: int, address: str) -> int:
    for binding in container.ports.get(f"{port}/tcp") or []:
        if binding.get("HostIp") == address:
            return int(binding["HostPort"])
    raise ScenarioFailed("start", f"port {port} of {container.name} is not published on {address}")


def stop_service_container(container: Container, stop_timeout_s: float, log_file: Path) -> tuple[int, str]:
    """Stop the service (SIGTERM, then SIGKILL), keep its log in log_file, remove it: its exit code
    and the log's tail."""
    try:
        with docker_errors("stop"):
            container.stop(timeout=math.ceil(stop_timeout_s))
            exit_code = int(container.wait()["StatusCode"])
            output = container.logs(stdout=True, stderr=True)
    finally:
        remove(container)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(output)
    return exit_code, tail(output)


def _listening(container: Container) -> dict[str, Any]:
    return listening_event(container.logs(stdout=True, stderr=False).splitlines())
