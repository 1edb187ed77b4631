"""End to end under a real Docker engine (issue 12): docker-compose.yml built and up as the README
says, every service healthy and answering on loopback, the standing services by hand.

Selected only with PROTOLAB_DOCKER_TESTS=1 (tests/conftest.py); CI sets it and exports
tests/docker/substitutes.env, whose images stand in for the official ones (tests/docker/README.md).
Grafana and k6 (profile "tools") are not started: Grafana has no substitute, the runner starts its
own k6 containers. A missing engine, Compose or image fails the tests and says what is missing. The
lab comes up once for every docker test (tests/e2e/conftest.py).
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.stacks import STACKS
from tests.e2e.docker_lab import (
    INFLUXDB,
    INFLUXDB_READER,
    NOT_STARTED,
    STANDING,
    compose,
    compose_up,
    docker,
    json_lines,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

# Every service compose starts here and how it answers on its published loopback port: what a
# plain `up -d` starts (but Grafana), then the standing services.
LAB_ANSWERS = {
    "prometheus": (9090, "http", "/-/ready"),
    "influxdb": (8086, "http", "/ping"),
}
# Each declared stack's server on the port it declares: gRPC health, or REST's /healthz.
STANDING_ANSWERS = {
    stack.compose_name: (stack.port, "grpc", "")
    if "grpc" in stack.protocols
    else (stack.port, "http", "/healthz")
    for stack in STACKS
}
ONE_SHOTS = {"certs"}  # must have exited 0


# --- The checks -------------------------------------------------------------------------------------


def _check_answers(answers: dict[str, tuple[int, str, str]], states: dict[str, dict[str, Any]]) -> None:
    """Each of these services runs healthy, published on 127.0.0.1 only, and answers there."""
    for name, (port, protocol, path) in answers.items():
        container = states[name]
        assert (container["State"], container["Health"]) == ("running", "healthy"), container
        published = {(p["URL"], p["PublishedPort"]) for p in container["Publishers"] if p["PublishedPort"]}
        assert ("127.0.0.1", port) in published and {url for url, _ in published} == {"127.0.0.1"}, (
            name,
            container["Publishers"],
        )
        if protocol == "grpc":
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)]) as ch:
                answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, name
        else:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
                assert response.status in (200, 204), (name, response.status)


def _states() -> dict[str, dict[str, Any]]:
    return {c["Service"]: c for c in json_lines(compose(*STANDING, "ps", "-a", "--format", "json").stdout)}


def test_a_plain_up_starts_what_the_runner_needs_and_no_service_to_measure_against(lab: list[str]) -> None:
    assert set(lab) == set(LAB_ANSWERS) | ONE_SHOTS, "a service was added: say how it answers"
    states = _states()
    assert set(states) == set(lab), states.keys()
    for name in ONE_SHOTS:
        assert (states[name]["State"], states[name]["ExitCode"]) == ("exited", 0), states[name]
    _check_answers(LAB_ANSWERS, states)


def test_the_standing_services_come_up_by_hand_healthy_and_answer_on_loopback(lab: list[str]) -> None:
    every = compose(*STANDING, "config", "--services").stdout.split()
    standing = sorted(set(every) - set(lab) - NOT_STARTED)
    assert set(standing) == set(STANDING_ANSWERS), "a service was added: say how it answers"
    # The README's `docker compose --profile services up -d`, Grafana left out (no substitute here).
    compose_up(standing, *STANDING)
    try:
        states = _states()
        assert set(states) == set(lab) | set(standing), states.keys()
        _check_answers({**LAB_ANSWERS, **STANDING_ANSWERS}, states)
    finally:
        # The runs below see the lab as a plain `up -d` leaves it: nothing idles beside them.
        compose(*STANDING, "rm", "--stop", "--force", *standing)
    assert set(_states()) == set(lab)


def test_the_lab_runs_hardened_with_influxdb_auth_and_no_ca_key_in_the_shared_volume(lab: list[str]) -> None:
    """What docs/docker.md's "Hardening" promises, as the engine applied it."""
    states = _states()
    running = [name for name in lab if name not in ONE_SHOTS]
    assert running, "nothing to inspect"
    for name in lab:
        [inspected] = json.loads(docker("inspect", states[name]["ID"]))
        host, config = inspected["HostConfig"], inspected["Config"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], name
        assert "no-new-privileges:true" in host["SecurityOpt"], name
        assert host["ReadonlyRootfs"] is True and host["PidsLimit"] > 0, name
        assert host["LogConfig"]["Type"] == "json-file" and host["LogConfig"]["Config"]["max-size"], name
        expected = "no" if name in ONE_SHOTS else "on-failure"
        assert host["RestartPolicy"]["Name"] == expected, (name, host["RestartPolicy"])
        if (
            name in running
        ):  # the user its processes run as (uid 0 shows as root), not only the configured one
            users = [
                line.split()[1]
                for line in docker("top", states[name]["ID"], "-o", "pid,user").splitlines()[1:]
            ]
            assert users and "root" not in users, (name, users)
        assert config["User"].split(":")[0] not in {"", "root", "0"}, (name, config["User"])
    # InfluxDB refuses anyone without a password; its reader reads.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(f"{INFLUXDB}/query?q=SHOW%20DATABASES", timeout=10)
    assert refused.value.code == 401
    user, password = INFLUXDB_READER
    query = urllib.parse.urlencode({"q": "SHOW DATABASES", "u": user, "p": password})
    with opener.open(f"{INFLUXDB}/query?{query}", timeout=10) as response:
        assert '["myk6db"]' in response.read().decode()
    # Every service mounts the certs volume: it holds no key that could sign a certificate.
    listing = docker(
        "run", "--rm", "-v", "protolab-certs:/certs:ro", "--entrypoint", "ls", "protolab-base:local", "/certs"
    )
    assert sorted(listing.split()) == ["ca.pem", "server-key.pem", "server.pem"]
