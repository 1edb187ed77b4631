"""docker-compose.yml without a Docker engine: valid against the Compose specification, loaded by the
real compose as this suite reads it, a plain `up` starting only what the runner needs, and no start
without a Grafana password.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.compose_file import COMPOSE_FILE, REQUIRED_ENV, compose, compose_variables
from tests.integration.compose_support import contract_services, published, systems_under_test
from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

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
        # `config` writes a literal $ as $$ again, as the file must.
        loaded_test = [part.replace("$$", "$") for part in loaded_check.get("test", [])] or None
        assert check.get("test") == loaded_test, name
        assert sorted(published(service)) == sorted(published(loaded[name])), name


def test_a_plain_up_starts_what_the_runner_needs_and_no_service_it_would_measure_against() -> None:
    # What `docker compose up -d` starts: the lab without its profiles.
    plain = _run_compose_config(REQUIRED_ENV, "--services", profiles=())
    assert plain.returncode == 0, plain.stderr
    assert set(plain.stdout.split()) == {"prometheus", "influxdb", "grafana", "certs"}
    services = compose()["services"]
    standing = {name for name, service in services.items() if service.get("profiles") == ["services"]}
    assert standing == set(systems_under_test(compose())) == {name for *_, name in contract_services()}


@pytest.mark.parametrize("variable", sorted(REQUIRED_ENV))
def test_docker_compose_refuses_to_start_without_each_password(variable: str) -> None:
    """Grafana's admin password (the user's) and InfluxDB's users' (scripts/setup.sh's): no default."""
    result = _run_compose_config({k: v for k, v in REQUIRED_ENV.items() if k != variable})
    assert result.returncode != 0
    assert variable in result.stderr
