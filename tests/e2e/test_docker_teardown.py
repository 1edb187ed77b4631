"""The last docker test (files run in the order of their names): `docker compose down -v` leaves no
container, volume or network of the lab, and none of the runner's containers.
"""

import pytest

from tests.e2e.docker_lab import PROJECT, STANDING, compose, docker, managed_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


def test_compose_down_leaves_nothing(lab: list[str]) -> None:
    compose(*STANDING, "down", "-v", "--remove-orphans")
    project = f"label=com.docker.compose.project={PROJECT}"
    assert docker("ps", "-a", "-q", "--filter", project) == ""
    assert managed_containers() == []
    volumes = docker("volume", "ls", "--format", "{{.Name}}").split()
    assert [v for v in volumes if v.startswith(PROJECT)] == [], volumes
    assert docker("volume", "ls", "-q", "--filter", project) == ""
    networks = docker("network", "ls", "--format", "{{.Name}}").split()
    assert [n for n in networks if n.startswith(PROJECT)] == [], networks
