"""docker-compose.yml and services/Dockerfile without a Docker engine, their safety: pinned images,
ports on loopback (or the publish address), no docker socket or privileges, no default Grafana
password, no root in the service images, and a build context without generated or private files.
"""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from services.common.stacks import STACKS
from tests.compose_file import COMPOSE_FILE, REQUIRED_ENV, InterpolationError, compose, raw_compose, resolve
from tests.integration.compose_support import (
    ENV_EXAMPLE,
    LOOPBACK,
    dockerfile_stages,
    dockerignore_includes,
    image_user,
    published,
)
from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# --- Safety ------------------------------------------------------------------------------------

# An exact version, and the digest scripts/pin_images.py adds once a registry is reachable.
_DIGEST = r"(?:@sha256:[0-9a-f]{64})?"
_EXACT_TAG = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+[\w.-]*" + _DIGEST + "$")


def test_every_image_is_pinned_to_an_exact_version() -> None:
    for name, service in compose()["services"].items():
        image = service.get("image", "")
        if "build" in service:
            assert image.endswith(":local"), f"{name}: a built image is tagged :local, got {image!r}"
        else:
            assert _EXACT_TAG.match(image), f"{name}: {image!r} is not pinned to an exact version"
    stages = dockerfile_stages(ROOT / "services" / "Dockerfile")
    for base in {stage.base for stage in stages} - {stage.name for stage in stages}:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+" + _DIGEST, base), (
            f"services/Dockerfile: FROM {base}"
        )


def test_every_published_port_is_bound_to_loopback() -> None:
    for name, service in compose()["services"].items():
        assert service.get("network_mode") != "host", name
        for host_ip, host_port, target in published(service):
            assert host_ip == LOOPBACK, f"{name}: port {target} published on {host_ip or 'every interface'}"
            assert host_port, f"{name}: port {target} needs an explicit host port"


# Linux's default ephemeral range: a port published inside it can be held by an outgoing
# connection's TIME_WAIT (docs/docker.md says so and names the sysctl that reserves it).
_EPHEMERAL = range(32768, 61000)


def _published_ports(within: range) -> set[int]:
    return {
        int(host_port)
        for service in compose()["services"].values()
        for _, host_port, _ in published(service)
        if int(host_port) in within
    }


def test_the_ports_published_in_the_ephemeral_range_are_the_ones_docs_tell_to_reserve() -> None:
    inside = _published_ports(_EPHEMERAL)
    told = re.search(r"ip_local_reserved_ports=([\d,-]+)`", (ROOT / "docs" / "docker.md").read_text())
    assert told, "docs/docker.md: the sysctl that reserves the published ports is gone"
    reserved: set[int] = set()
    for part in told.group(1).split(","):
        low, _, high = part.partition("-")
        reserved.update(range(int(low), int(high or low) + 1))
    assert inside == reserved, f"published in the ephemeral range: {sorted(inside)}; docs: {sorted(reserved)}"


def test_ci_reserves_the_ports_compose_publishes_in_this_hosts_ephemeral_range() -> None:
    """.ci/docker-engine.sh reads the ports out of the file with grep; compose's own reading is the truth."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    script = [str(ROOT / ".ci" / "docker-engine.sh"), "ephemeral-ports", str(COMPOSE_FILE)]
    printed = subprocess.run(script, capture_output=True, text=True, check=True).stdout.split()
    assert {int(port) for port in printed} == _published_ports(range(low, high + 1)), printed


def test_publish_address_moves_the_services_and_influxdb_and_the_certificate_names_it() -> None:
    moved = compose({**REQUIRED_ENV, "PUBLISH_ADDRESS": "10.0.0.5"})["services"]
    on_address = {
        name for name, service in moved.items() if any(ip == "10.0.0.5" for ip, _, _ in published(service))
    }
    services = {stack.package.replace("_", "-") for stack in STACKS}  # each declared stack's compose service
    assert on_address == {"influxdb", *services}
    for name in ("prometheus", "grafana"):  # they stay on the service host's loopback
        assert {ip for ip, _, _ in published(moved[name])} == {LOOPBACK}, name
    assert moved["certs"]["command"][-2:] == ["--san", "10.0.0.5"]


def test_no_container_gets_the_docker_socket_or_privileges() -> None:
    text = COMPOSE_FILE.read_text()
    assert "docker.sock" not in text
    for name, service in compose()["services"].items():
        assert not service.get("privileged"), name
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else str(volume).split(":")[0]
            assert not source.startswith("/var/run") and not source.startswith("/run"), (name, volume)


def test_grafana_has_no_default_admin_password() -> None:
    raw_env = raw_compose()["services"]["grafana"]["environment"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", raw_env["GF_SECURITY_ADMIN_PASSWORD"])
    others = {k: v for k, v in REQUIRED_ENV.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    with pytest.raises(InterpolationError, match="GRAFANA_ADMIN_PASSWORD"):
        resolve(raw_compose(), others)
    with pytest.raises(InterpolationError, match="GRAFANA_ADMIN_PASSWORD"):
        resolve(raw_compose(), {**others, "GRAFANA_ADMIN_PASSWORD": ""})
    env = compose()["services"]["grafana"]["environment"]
    if env.get("GF_AUTH_ANONYMOUS_ENABLED") == "true":
        assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    example = dict(re.findall(r"^(\w+)=(.*)$", ENV_EXAMPLE.read_text(), re.M))
    assert example["GRAFANA_ADMIN_PASSWORD"] == "", ".env.example must not ship a password"


def test_service_images_do_not_run_as_root() -> None:
    for name, service in compose()["services"].items():
        if isinstance(service.get("build"), dict):
            user = image_user(service["build"])
            assert user.split(":")[0] not in {"root", "0"}, f"{name} runs as {user}"
            assert service.get("user") in (None, user), name


def test_every_build_context_and_copy_source_exists() -> None:
    checked: dict[str, int] = {}  # built service -> COPY sources checked
    for name, service in compose()["services"].items():
        build = service.get("build")
        if not build:
            continue
        checked[name] = 0
        context = ROOT / build["context"]
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
        stages = dockerfile_stages(dockerfile)
        targets = {stage.name for stage in stages}
        assert build.get("target") in targets | {None}, f"{name}: no stage {build.get('target')}"
        for stage in stages:
            for keyword, rest in stage.instructions:
                if keyword not in {"COPY", "ADD"} or "--from=" in rest:
                    continue
                *sources, _ = [token for token in shlex.split(rest) if not token.startswith("--")]
                for source in sources:
                    assert (context / source).exists(), f"{dockerfile}: COPY {source} does not exist"
                    assert dockerignore_includes(context, source), f"{source} is excluded by .dockerignore"
                    checked[name] += 1
    # The loops ran: compose builds images, and each build copies something from its context.
    assert checked, "no service in docker-compose.yml is built"
    assert all(checked.values()), checked


def test_generated_and_private_files_stay_out_of_the_build_context() -> None:
    for path in (
        "certs/server-key.pem",
        ".git/config",
        ".venv/bin/python",
        "results/x.json",
        "services/common/pb/cars_pb2.py",
        "services/grpc_aio/__pycache__/x.pyc",
        ".env",
    ):
        assert not dockerignore_includes(ROOT, path), path


# --- Hardening (docs/docker.md) ----------------------------------------------------------------

ONE_SHOTS = {"certs", "k6"}  # exit when done: never restarted


def test_every_container_is_hardened_like_the_services() -> None:
    services = compose()["services"]
    assert {"prometheus", "influxdb", "grafana", "k6", "certs"} <= set(services)
    for name, service in services.items():
        assert service.get("cap_drop") == ["ALL"] and not service.get("cap_add"), name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert service.get("read_only") is True, name
        assert 0 < int(service["pids_limit"]) <= 4096, name
        logging = service["logging"]
        assert logging["driver"] == "json-file" and logging["options"]["max-size"], name
        assert int(logging["options"]["max-file"]) >= 1, name
        restart = str(service.get("restart"))
        if name in ONE_SHOTS:
            assert restart == "no", name
        else:  # a crash is retried a few times, never looped for ever (unless-stopped, always)
            assert re.fullmatch(r"on-failure:[1-9]\d?", restart), (name, restart)


def test_no_container_of_the_lab_runs_as_root() -> None:
    for name, service in compose()["services"].items():
        # Built images: their USER; the official images: their own (prom/prometheus nobody,
        # grafana 472, k6 12345), or the one compose names (InfluxDB 1.8's runs as root otherwise).
        user = service.get("user") or (image_user(service["build"]) if "build" in service else None)
        if name == "influxdb":
            assert user == "influxdb", user
        assert str(user).split(":")[0] not in {"root", "0"}, (name, user)


def test_prometheus_has_no_lifecycle_api() -> None:
    # With it, anyone who reaches the port can POST /-/quit (tests/integration/test_observability.py
    # shows the refusal on a real Prometheus started as the local backend starts it).
    assert not [flag for flag in compose()["services"]["prometheus"]["command"] if "lifecycle" in flag]
