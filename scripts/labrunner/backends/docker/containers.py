"""Containers as every part of the docker backend makes and ends them: none left behind, an engine
error the scenario's, their logs."""

import contextlib
from collections.abc import Iterator
from typing import Any

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from labrunner.backends.base import LOG_TAIL_LINES, ScenarioFailed, tail


@contextlib.contextmanager
def docker_errors(phase: str) -> Iterator[None]:
    """An engine error ends the scenario with the engine's own explanation."""
    try:
        yield
    except DockerException as exc:
        raise ScenarioFailed(phase, f"docker: {exc}") from exc


def create_container(client: docker.DockerClient, phase: str, **params: Any) -> Container:
    """containers.create on client; when it is interrupted, whatever the engine made under that
    name goes."""
    try:
        with docker_errors(phase):
            return client.containers.create(**params)
    except BaseException:
        with contextlib.suppress(DockerException):
            remove(client.containers.get(params["name"]))
        raise


def remove(container: Container) -> None:
    with contextlib.suppress(NotFound):
        container.remove(force=True)


def logs_tail(container: Container) -> str:
    with contextlib.suppress(DockerException):
        return tail(container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES))
    return ""
