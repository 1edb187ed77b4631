"""docker-compose.yml and services/Dockerfile without a Docker engine: schema, safety, wiring, native runs."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import DEFAULT_PORTS
from tests.compose_file import (
    COMPOSE_FILE,
    REQUIRED_ENV,
    InterpolationError,
    compose,
    compose_variables,
    raw_compose,
    resolve,
)
from tests.support import ROOT, RunningService, free_ports, launch_service

ENV_EXAMPLE = ROOT / ".env.example"
CONTRACTS = ROOT / "docs" / "CONTRACTS.md"
LOOPBACK = "127.0.0.1"


# --- Dockerfiles, .dockerignore ------------------------------------------------------------


@dataclass
class Stage:
    """One FROM section of a Dockerfile and its instructions, continuation lines joined."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(path: Path) -> list[Stage]:
    """Parse FROM ... [AS name] sections; comments dropped, backslash continuations joined."""
    logical = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: FROM may use their defaults
    for line in logical.splitlines():
        if not line.strip():
            continue
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            parts = _substitute(rest, global_args).split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return stages


def stage_chain(stages: list[Stage], target: str | None) -> list[Stage]:
    """The target stage (default: the last) and the stages it builds FROM, outermost first."""
    by_name = {stage.name: stage for stage in stages if stage.name}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        chain.insert(0, stage)
    return chain


def _substitute(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], ""), text)


def image_environment(build: Mapping[str, Any]) -> dict[str, str]:
    """ENV a container of this build gets from its image, with the compose build args applied."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    args = {key: str(value) for key, value in (build.get("args") or {}).items()}
    env: dict[str, str] = {}
    for stage in stage_chain(stages, build.get("target")):
        for keyword, rest in stage.instructions:
            if keyword == "ENV":
                for token in shlex.split(rest):
                    key, _, value = token.partition("=")
                    env[key] = _substitute(value, {**args, **env})
    return env


def image_user(build: Mapping[str, Any]) -> str:
    """The USER a container of this build runs as ("root" when the Dockerfile never sets one)."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    users = [
        rest
        for stage in stage_chain(stages, build.get("target"))
        for kw, rest in stage.instructions
        if kw == "USER"
    ]
    return users[-1] if users else "root"


def image_healthcheck(build: Mapping[str, Any]) -> list[str]:
    """The exec-form HEALTHCHECK CMD of this build's image."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    checks = [
        rest
        for stage in stage_chain(stages, build.get("target"))
        for kw, rest in stage.instructions
        if kw == "HEALTHCHECK"
    ]
    assert checks, "the image has no HEALTHCHECK"
    return json.loads(checks[-1].split(" CMD ", 1)[1])


def dockerignore_includes(context: Path, relative: str) -> bool:
    """Whether .dockerignore sends this path (or any file under this folder) to the builder."""
    ignore = context / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines()] if ignore.exists() else []
    included = True
    path = relative.strip("/")
    prefixes = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
    for line in (p for p in patterns if p and not p.startswith("#")):
        pattern = line.lstrip("!").strip("/")
        if any(fnmatch(prefix, pattern) for prefix in prefixes):
            included = line.startswith("!")
    return included


# --- Shared facts ---------------------------------------------------------------------------


def contract_services() -> list[tuple[str, int, int, str]]:
    """(module, port, metrics port, compose name) rows of the services table in docs/CONTRACTS.md."""
    row = r"^\|[^|]*\|\s*services\.(\w+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\w-]+)\s*\|"
    rows = re.findall(row, CONTRACTS.read_text(), re.M)
    assert rows, "no services table in docs/CONTRACTS.md"
    return [(module, int(port), int(metrics), name) for module, port, metrics, name in rows]


def systems_under_test(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services built from the service stage of services/Dockerfile."""
    return {
        name: service
        for name, service in config["services"].items()
        if isinstance(service.get("build"), dict) and service["build"].get("target") == "service"
    }


def published(service: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of every published port, short or long syntax."""
    result = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result.append((port.get("host_ip", ""), str(port.get("published", "")), str(port["target"])))
        else:
            parts = str(port).rsplit("/", 1)[0].split(":")
            host_ip = parts[0] if len(parts) == 3 else ""
            result.append((host_ip, parts[-2] if len(parts) > 1 else "", parts[-1]))
    return result


def container_port(config: Mapping[str, Any], host: str, port: int) -> bool:
    """Whether compose service `host` listens on `port` inside the network (published or built in)."""
    service = config["services"].get(host)
    if service is None:
        return False
    ports = {int(target) for _, _, target in published(service)}
    if isinstance(service.get("build"), dict):
        env = image_environment(service["build"])
        ports |= {int(env[key]) for key in ("PORT", "METRICS_PORT") if env.get(key)}
    return port in ports


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|s|m|h)", duration))


# --- Schema and the real compose loader ------------------------------------------------------


def test_compose_file_validates_against_the_compose_specification() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE_FILE),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], check=False, capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    for candidate in (shutil.which("docker-compose"), Path(sys.executable).parent / "docker-compose"):
        if candidate and Path(candidate).is_file():
            return [str(candidate)]
    return None


def _run_compose_config(
    env: Mapping[str, str], *args: str, profiles: tuple[str, ...] = ("services", "tools")
) -> subprocess.CompletedProcess[str]:
    """`docker compose config` with these profiles (default: every one), as JSON unless args say."""
    cli = _compose_cli()
    if cli is None:
        pytest.fail("neither `docker compose` nor docker-compose is installed (scripts/setup.sh installs it)")
    clean = {k: v for k, v in os.environ.items() if k not in compose_variables()}
    clean = {k: v for k, v in clean.items() if not k.startswith("COMPOSE_")}
    with tempfile.NamedTemporaryFile("w", suffix=".env") as env_file:  # ignore a developer's .env
        return subprocess.run(
            [
                *cli,
                "--env-file",
                env_file.name,
                *(option for profile in profiles for option in ("--profile", profile)),
                "-f",
                str(COMPOSE_FILE),
                "config",
                *(args or ("--format", "json")),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env={**clean, **env},
        )


@pytest.mark.parametrize("user_env", [{}, {"SUT_TLS": "1", "SUT_CPUS": "0.5", "SUT_WORKERS": "1"}])
def test_docker_compose_loads_the_file_as_this_suite_reads_it(user_env: dict[str, str]) -> None:
    result = _run_compose_config({**REQUIRED_ENV, **user_env})
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)["services"]
    ours = compose(user_env)["services"]
    assert set(loaded) == set(ours)
    for name, service in ours.items():
        assert {k: str(v) for k, v in (service.get("environment") or {}).items()} == (
            loaded[name].get("environment") or {}
        ), name
        assert service.get("command") == loaded[name].get("command"), name
        check, loaded_check = service.get("healthcheck") or {}, loaded[name].get("healthcheck") or {}
        assert check.get("test") == loaded_check.get("test"), name
        assert sorted(published(service)) == sorted(published(loaded[name])), name


def test_a_plain_up_starts_what_the_runner_needs_and_no_service_it_would_measure_against() -> None:
    # What `docker compose up -d` starts: the lab without its profiles.
    plain = _run_compose_config(REQUIRED_ENV, "--services", profiles=())
    assert plain.returncode == 0, plain.stderr
    assert set(plain.stdout.split()) == {"prometheus", "influxdb", "grafana", "certs"}
    services = compose()["services"]
    standing = {name for name, service in services.items() if service.get("profiles") == ["services"]}
    assert standing == set(systems_under_test(compose())) == {name for *_, name in contract_services()}


def test_docker_compose_refuses_to_start_without_a_grafana_password() -> None:
    result = _run_compose_config({})
    assert result.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in result.stderr


# --- Safety ------------------------------------------------------------------------------------

_EXACT_TAG = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+[\w.-]*$")


def test_every_image_is_pinned_to_an_exact_version() -> None:
    for name, service in compose()["services"].items():
        image = service.get("image", "")
        if "build" in service:
            assert image.endswith(":local"), f"{name}: a built image is tagged :local, got {image!r}"
        else:
            assert _EXACT_TAG.match(image), f"{name}: {image!r} is not pinned to an exact version"
    stages = dockerfile_stages(ROOT / "services" / "Dockerfile")
    for base in {stage.base for stage in stages} - {stage.name for stage in stages}:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+", base), f"services/Dockerfile: FROM {base}"


def test_every_published_port_is_bound_to_loopback() -> None:
    for name, service in compose()["services"].items():
        assert service.get("network_mode") != "host", name
        for host_ip, host_port, target in published(service):
            assert host_ip == LOOPBACK, f"{name}: port {target} published on {host_ip or 'every interface'}"
            assert host_port, f"{name}: port {target} needs an explicit host port"


def test_publish_address_moves_the_services_and_influxdb_and_the_certificate_names_it() -> None:
    moved = compose({**REQUIRED_ENV, "PUBLISH_ADDRESS": "10.0.0.5"})["services"]
    on_address = {
        name for name, service in moved.items() if any(ip == "10.0.0.5" for ip, _, _ in published(service))
    }
    services = {"rest-aiohttp", "rest-quart", "grpc-aio", "rest-granian", "grpc-grpclib"}
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
    with pytest.raises(InterpolationError, match="GRAFANA_ADMIN_PASSWORD"):
        resolve(raw_compose(), {})
    with pytest.raises(InterpolationError):
        resolve(raw_compose(), {"GRAFANA_ADMIN_PASSWORD": ""})
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
    for name, service in compose()["services"].items():
        build = service.get("build")
        if not build:
            continue
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


# --- Shape and wiring ------------------------------------------------------------------------


def test_services_agree_with_the_contract_table() -> None:
    config = compose()
    suts = systems_under_test(config)
    assert {name for *_, name in contract_services()} == set(suts)
    for module, port, metrics_port, name in contract_services():
        service = suts[name]
        assert service["command"] == ["python", "-m", f"services.{module}"]
        env = image_environment(service["build"])
        assert (env["PROTOLAB_SERVICE"], env["PORT"], env["METRICS_PORT"]) == (
            module,
            str(port),
            str(metrics_port),
        )
        assert env["HOST"] == "0.0.0.0"
        assert set(published(service)) == {(LOOPBACK, str(p), str(p)) for p in (port, metrics_port)}
        assert service["image"] == f"protolab-{name}:local"


def test_the_services_default_ports_are_the_contract_tables() -> None:
    # The ports a service takes without PORT / METRICS_PORT, as compose builds its image with them.
    assert {module: (port, metrics) for module, port, metrics, _ in contract_services()} == DEFAULT_PORTS


def test_matrix_services_and_profile_p1_match_compose() -> None:
    matrix = tomllib.loads((ROOT / "matrix.toml").read_text())
    config = compose()
    built = {s["build"]["args"]["SERVICE"] for s in systems_under_test(config).values()}
    assert {target["service"] for target in matrix["targets"].values()} <= built
    for service in systems_under_test(config).values():
        assert float(service["cpus"]) == matrix["profiles"]["p1"]["cpus"]
        assert service["mem_limit"] == service["memswap_limit"] == matrix["profiles"]["p1"]["memory"]
    overridden = systems_under_test(compose({"SUT_CPUS": "0.5", "SUT_MEMORY": "512m"}))
    limits = {(s["cpus"], s["mem_limit"], s["memswap_limit"]) for s in overridden.values()}
    assert limits == {("0.5", "512m", "512m")}


def test_health_checks_and_dependencies_are_explicit() -> None:
    config = compose()
    for name, service in config["services"].items():
        if name == "certs" or "tools" in service.get("profiles", []):
            continue
        check = service.get("healthcheck", {})
        for key in ("test", "interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name}: healthcheck without {key}"
    for name, service in config["services"].items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            assert isinstance(spec, dict) and "condition" in spec, f"{name} -> {dependency}"
            target = config["services"][dependency]
            expected = "service_completed_successfully" if dependency == "certs" else "service_healthy"
            assert spec["condition"] == expected, f"{name} -> {dependency}"
            if expected == "service_healthy":
                assert "healthcheck" in target, dependency


def test_stop_grace_period_outlasts_the_graceful_shutdown() -> None:
    for name, service in systems_under_test(compose()).items():
        env = service["environment"]
        budget = float(env["SHUTDOWN_DRAIN_SECONDS"]) + float(env["SHUTDOWN_GRACE_SECONDS"])
        assert _seconds(service["stop_grace_period"]) > budget, name


def test_data_lives_in_named_volumes() -> None:
    config = compose()
    expected = {"prometheus": "/prometheus", "influxdb": "/var/lib/influxdb", "grafana": "/var/lib/grafana"}
    for name, target in expected.items():
        volumes = [str(v) for v in config["services"][name]["volumes"]]
        named = [v for v in volumes if v.endswith(f":{target}") and not v.startswith(".")]
        assert named and named[0].split(":")[0] in config["volumes"], name
    assert config["volumes"]["certs"]["name"] == "protolab-certs"
    assert config["networks"]["default"]["name"] == "protolab"


def test_config_folders_are_mounted_whole_and_read_only() -> None:
    config = compose()["services"]
    mounts = {
        "prometheus": ("./prometheus:/etc/prometheus:ro",),
        "influxdb": ("./influxdb:/etc/influxdb:ro", "./influxdb/init:/docker-entrypoint-initdb.d:ro"),
        "grafana": (
            "./grafana/provisioning:/etc/grafana/provisioning:ro",
            "./grafana/dashboards:/var/lib/grafana/dashboards:ro",
        ),
        "k6": ("./k6:/k6:ro", "./proto:/proto:ro"),
    }
    for name, expected in mounts.items():
        for mount in expected:
            assert mount in config[name]["volumes"], (name, mount)
            assert (ROOT / mount.split(":")[0]).is_dir(), mount
    assert (ROOT / "influxdb" / "influxdb.conf").is_file()


def test_every_compose_variable_is_documented_in_env_example() -> None:
    documented = set(re.findall(r"^(\w+)=", ENV_EXAMPLE.read_text(), re.M))
    assert documented == compose_variables()


def test_prometheus_config_fits_its_mount() -> None:
    config = compose()["services"]["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in config["command"]
    prometheus = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    for job in prometheus["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            for pattern in sd["files"]:
                assert pattern.startswith("/etc/prometheus/targets/"), pattern
                assert (ROOT / "prometheus" / "targets").is_dir()
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                assert host == "localhost" and (LOOPBACK, port, port) in published(config), target


def test_clients_point_at_compose_services() -> None:
    config = compose({"SUT_TLS": "1"})
    urls = [
        source["url"]
        for path in sorted((ROOT / "grafana" / "provisioning" / "datasources").glob("*.y*ml"))
        for source in yaml.safe_load(path.read_text()).get("datasources", [])
    ]
    k6 = config["services"]["k6"]["environment"]
    urls += [k6["K6_OUT"].split("=", 1)[1], k6["BASE_URL"], f"grpc://{k6['GRPC_ADDR']}"]
    assert k6["BASE_URL"].startswith("https://") and k6["TLS"] == "1"
    for url in urls:
        host, port = re.fullmatch(r"\w+://([\w-]+):(\d+)(?:/.*)?", url).groups()
        assert container_port(config, host, int(port)), url
    database = config["services"]["influxdb"]["environment"]["INFLUXDB_DB"]
    assert k6["K6_OUT"].endswith(f"/{database}")
    init = "".join(p.read_text() for p in (ROOT / "influxdb" / "init").glob("*.iql"))
    assert f"CREATE DATABASE {database}" in init
    for path in (ROOT / "grafana" / "provisioning" / "dashboards").glob("*.y*ml"):
        grafana_mounts = [str(v).split(":")[1] for v in config["services"]["grafana"]["volumes"]]
        for provider in yaml.safe_load(path.read_text()).get("providers", []):
            assert provider["options"]["path"] in grafana_mounts, provider


def test_influxdb_healthcheck_waits_for_the_k6_database(tmp_path: Path) -> None:
    assert shutil.which("influxd") and shutil.which("curl"), "needs influxd and curl: run scripts/setup.sh"
    kind, check = compose()["services"]["influxdb"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and "127.0.0.1:8086/" in check
    http_port, rpc_port = free_ports(2)
    data = {f"INFLUXDB_{key}_DIR": str(tmp_path / key.lower()) for key in ("META", "DATA", "DATA_WAL")}
    env = {
        **os.environ,
        **data,
        "INFLUXDB_HTTP_BIND_ADDRESS": f"{LOOPBACK}:{http_port}",
        "INFLUXDB_BIND_ADDRESS": f"{LOOPBACK}:{rpc_port}",
    }
    argv = ["influxd", "-config", str(ROOT / "influxdb" / "influxdb.conf")]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://{LOOPBACK}:{http_port}"
    native_check = ["sh", "-c", check.replace("127.0.0.1:8086/", f"{LOOPBACK}:{http_port}/")]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                opener.open(f"{url}/ping", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "influxd did not start"
                time.sleep(0.1)
        assert subprocess.run(native_check, check=False, timeout=10).returncode != 0, "healthy without myk6db"
        # What the image's entrypoint does with /docker-entrypoint-initdb.d/*.iql on first start.
        for iql in sorted((ROOT / "influxdb" / "init").glob("*.iql")):
            body = urllib.parse.urlencode({"q": iql.read_text()}).encode()
            opener.open(f"{url}/query", data=body, timeout=10).close()
        assert subprocess.run(native_check, check=False, timeout=10).returncode == 0
    finally:
        process.terminate()
        process.wait(timeout=15)


# --- The strongest one: each service's compose command and environment, run natively --------


@pytest.fixture(scope="module")
def compose_certs() -> Iterator[Path]:
    """The certs one-shot's command (as a user gets it: no PUBLISH_ADDRESS), run natively into a
    folder that stands in for /certs."""
    certs = compose()["services"]["certs"]
    command = certs["command"]
    assert command == ["python", "scripts/gen_certs.py", "--dir", "/certs", "--san", "127.0.0.1"]
    assert "certs:/certs" in certs["volumes"]
    with tempfile.TemporaryDirectory(prefix="protolab-certs-") as directory:
        native = [directory if part == "/certs" else part for part in command[1:]]
        subprocess.run([sys.executable, *native], cwd=ROOT, check=True, timeout=60)
        yield Path(directory)


def _native(env: Mapping[str, str], certs: Path) -> dict[str, str]:
    """Container paths under /certs mapped to the native stand-in folder."""
    return {
        key: str(certs / value.removeprefix("/certs/")) if value.startswith("/certs/") else value
        for key, value in env.items()
    }


def _run_check(test: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    assert test[0] == "CMD" and test[1] == "python", test
    argv = [sys.executable, *test[2:]]
    return subprocess.run(
        argv, check=False, cwd=ROOT, env={**env}, capture_output=True, text=True, timeout=30
    )


NATIVE_CASES = [(name, tls) for name in ("rest-aiohttp", "rest-quart", "grpc-aio") for tls in (False, True)]


@dataclass
class NativeRun:
    """A compose service started natively: its resolved compose entry, native env and process."""

    service: dict[str, Any]
    env: dict[str, str]
    running: RunningService


def _start_native(name: str, tls: bool, certs: Path) -> NativeRun:
    service = compose({"SUT_TLS": "1"} if tls else {})["services"][name]
    command = service["command"]
    assert command[:2] == ["python", "-m"] and command[2].startswith("services."), command
    container_env = {**image_environment(service["build"]), **service["environment"]}
    assert bool(container_env["TLS_CERT_FILE"]) == tls
    # What differs from the container: loopback instead of every interface, ephemeral ports
    # (other tests run services too), one worker, /certs mapped to a local folder.
    native = {**container_env, "HOST": LOOPBACK, "PORT": "0", "METRICS_PORT": "0", "WORKERS": "1"}
    env = _native(native, certs)
    return NativeRun(service, env, launch_service(command[2].removeprefix("services."), env))


@pytest.fixture(scope="module")
def native_runs(compose_certs: Path) -> Iterator[dict[tuple[str, bool], NativeRun | BaseException]]:
    """Every case started at once (start-up is mostly record-pool generation); each test stops its own."""
    with ThreadPoolExecutor(len(NATIVE_CASES)) as pool:
        starts = {case: pool.submit(_start_native, *case, compose_certs) for case in NATIVE_CASES}
    runs = {case: future.exception() or future.result() for case, future in starts.items()}
    yield runs
    for run in runs.values():
        if isinstance(run, NativeRun) and run.running.process.poll() is None:
            run.running.process.kill()
            run.running.process.wait()


@pytest.mark.parametrize(
    ("name", "tls"), NATIVE_CASES, ids=[f"{n}-{'tls' if t else 'plain'}" for n, t in NATIVE_CASES]
)
def test_compose_service_runs_natively_and_becomes_healthy(name: str, tls: bool, native_runs) -> None:
    run = native_runs[(name, tls)]
    if isinstance(run, BaseException):
        raise run
    running, service = run.running, run.service
    try:
        assert running.tls == tls
        check_env = {**os.environ, **run.env, "PORT": str(running.port)}
        for test in (service["healthcheck"]["test"], ["CMD", *image_healthcheck(service["build"])]):
            result = _run_check(test, check_env)
            assert result.returncode == 0, f"{test}: {result.stderr}"
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://{LOOPBACK}:{running.metrics_port}/metrics", timeout=10
        ) as response:
            assert response.status == 200
        # A healthcheck against a port nobody listens on must fail, or the checks above prove nothing.
        dead = _run_check(service["healthcheck"]["test"], {**check_env, "PORT": "1"})
        assert dead.returncode == 1, dead.stderr
    finally:
        exit_code = running.stop(signal.SIGTERM, timeout=_seconds(service["stop_grace_period"]))
    assert exit_code == 0
