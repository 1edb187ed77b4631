"""What the docker backend checks and prepares on its engines before any scenario: their versions,
the lab's network and volume, an interrupted run's containers, the k6 image."""

import ipaddress
import re
from collections.abc import Sequence
from typing import Any

import docker
from docker.errors import DockerException, ImageNotFound, NotFound
from requests.exceptions import RequestException

from labrunner.backends.base import BackendUnavailable
from labrunner.backends.docker.containers import remove
from labrunner.backends.docker.names import CERTS_VOLUME, MANAGED_LABEL, NETWORK
from labrunner.backends.engines import Engine
from labrunner.say import Say

# Engine 25 brought healthcheck start_interval, which docker-compose.yml uses; Compose v2 needs it too.
MIN_ENGINE_VERSION = (25, 0)
# Each engine's client once, with " on engine <name>" for messages ("" for the service's).
EngineClients = Sequence[tuple[docker.DockerClient, str]]


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


def checked(engine: Engine, role: str) -> Engine:
    """The engine, when its version is new enough; BackendUnavailable naming it otherwise."""
    try:
        check_engine_version(engine.client)
    except (BackendUnavailable, DockerException, RequestException) as exc:
        raise BackendUnavailable(f"{engine.describe(role)}: {exc}") from None
    return engine


def check_publish_address(load: Sequence[Engine], publish: str) -> None:
    """k6 on another host dials the publish address: it must not be this host's loopback."""
    remote = [engine.name for engine in load if not engine.on_this_host]
    if remote and ipaddress.ip_address(publish).is_loopback:
        raise BackendUnavailable(
            f"load engine {remote[0]} is another host: k6 there would dial its own {publish}; "
            "set --publish-address (or [hosts] publish_address) to this host's address the load "
            "hosts reach, and start the lab with PUBLISH_ADDRESS set to it"
        )


def check_lab_is_up(client: docker.DockerClient) -> None:
    """The compose network and certs volume exist on the service's engine."""
    for what, lookup in (
        (f"network {NETWORK}", lambda: client.networks.get(NETWORK)),
        (f"volume {CERTS_VOLUME}", lambda: client.volumes.get(CERTS_VOLUME)),
    ):
        try:
            lookup()
        except NotFound:
            raise BackendUnavailable(
                f"docker {what} not found: start the lab first (docker compose up -d), or use --backend local"
            ) from None


def prepare_engines(clients: EngineClients, k6_clients: EngineClients, k6_image: str, say: Say) -> None:
    """An interrupted run's containers removed from every engine, k6's image on each engine that runs it."""
    for engine_client, where in clients:
        # A load engine may be shared: another run's k6 still running there stays.
        if removed := remove_leftovers(engine_client, running_too=not where):
            names = ", ".join(removed)
            say(f"docker: removed {len(removed)} container(s) of an interrupted run{where}: {names}")
    for engine_client, where in k6_clients:
        try:
            engine_client.images.get(k6_image)
        except ImageNotFound:
            # `docker compose up -d` skips k6 (profile "tools"), so its image may be missing.
            say(f"docker: pulling {k6_image}{where}")
            repository, _, tag = k6_image.rpartition(":")
            engine_client.images.pull(repository, tag=tag)


def remove_leftovers(client: docker.DockerClient, running_too: bool = True) -> list[str]:
    """Remove every container an earlier, interrupted run left behind (running_too=False: the
    stopped ones only); their names."""
    filters: dict[str, Any] = {"label": f"{MANAGED_LABEL}=true"}
    if not running_too:
        filters["status"] = ["created", "exited", "dead"]
    leftovers = client.containers.list(all=True, filters=filters)
    for container in leftovers:
        remove(container)
    # A listed container always has a name; the stubs allow None for one not yet inspected.
    return [container.name or container.short_id for container in leftovers]
