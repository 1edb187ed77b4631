"""What the docker tests (tests/e2e/test_docker_*.py) share: compose and the docker CLI as a user runs
them, the engine's preflight (which names what is missing), the engine's events, and run_matrix.py
--backend docker as a subprocess. Their fixtures, the engine and the lab, are tests/e2e/conftest.py's.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.docker import names as docker_names
from labrunner.files import write_json_atomic
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization

from tests.support import QUICK_CALIBRATION, ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
PROJECT = "protolab"  # docker-compose.yml's `name:`
NOT_STARTED = {"grafana", "k6"}  # no substitute for Grafana; k6 is the runner's
STANDING = ("--profile", "services")  # the five services, up only when asked for
MIN_ENGINE = (25, 0)  # healthcheck start_interval
PROMETHEUS = "http://127.0.0.1:9090"
INFLUXDB = "http://127.0.0.1:8086"
# InfluxDB's users (docker-compose.yml) and the passwords these tests give them.
INFLUXDB_PASSWORDS = {
    "INFLUXDB_ADMIN_PASSWORD": "test-admin-9Qe2",
    "INFLUXDB_WRITE_PASSWORD": "test-writer-4Lm7",
    "INFLUXDB_READ_PASSWORD": "test-reader-8Xs1",
}
INFLUXDB_READER = ("protolab_reader", INFLUXDB_PASSWORDS["INFLUXDB_READ_PASSWORD"])
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
MANAGED = f"{docker_names.MANAGED_LABEL}=true"


# --- The engine and compose -----------------------------------------------------------------------


def _compose_env() -> dict[str, str]:
    """The environment with the image variables CI exports; none of a user's SUT_* or COMPOSE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUT_", "COMPOSE_"))}
    # Grafana is not started, but compose will not read the file without its password.
    env.setdefault("GRAFANA_ADMIN_PASSWORD", "unused-grafana-is-not-started")
    # What scripts/setup.sh generates into a user's .env; the runner reads the writer's from here.
    for name, password in INFLUXDB_PASSWORDS.items():
        env.setdefault(name, password)
    return env


def run_cli(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args, cwd=ROOT, env=_compose_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert result.returncode == 0, f"{' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result


def docker(*args: str, timeout: float = 60) -> str:
    return run_cli("docker", *args, timeout=timeout).stdout


def compose(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    # --env-file /dev/null: a developer's .env does not change what is tested.
    return run_cli(
        "docker", "compose", "--env-file", "/dev/null", "-f", str(COMPOSE_FILE), *args,
        timeout=timeout, check=check,
    )  # fmt: skip


def json_lines(text: str) -> list[dict[str, Any]]:
    """`--format json` output: one object per line (Compose 2.21+) or one array."""
    text = text.strip()
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def managed_containers() -> list[str]:
    names = docker("ps", "-a", "--filter", f"label={MANAGED}", "--format", "{{.Names}} {{.State}}")
    return names.splitlines()


@dataclass(frozen=True)
class Engine:
    version: str
    ncpu: int
    images: dict[str, str]  # role -> the image compose and the runner use here


def missing(what: str) -> None:
    pytest.fail(f"docker tests (PROTOLAB_DOCKER_TESTS=1): {what}", pytrace=False)


def preflight() -> Engine:
    """The engine, Compose v2 and every image the run needs, or a failure that names what is missing."""
    if shutil.which("docker") is None:
        missing(
            "no `docker` command on PATH; install Docker Engine >= 25 with Compose v2 "
            "(CI: .ci/docker-engine.sh install)"
        )
    info = run_cli("docker", "info", "--format", "{{json .}}", check=False, timeout=30)
    if info.returncode != 0:
        missing(
            f"no Docker engine answers `docker info` ({info.stderr.strip()[-500:]}); "
            "start it (CI: .ci/docker-engine.sh start)"
        )
    details = json.loads(info.stdout)
    version = details.get("ServerVersion", "")
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) < MIN_ENGINE:
        missing(f"Docker engine {version} is older than 25.0 (compose's healthcheck start_interval)")
    if run_cli("docker", "compose", "version", check=False).returncode != 0:
        missing("`docker compose` (the Compose v2 plugin) is not installed")
    config = compose("--profile", "tools", "config", "--format", "json", timeout=60, check=False)
    if config.returncode != 0:
        missing(f"`docker compose config` fails: {config.stderr.strip()[-1000:]}")
    services = json.loads(config.stdout)["services"]
    dockerfile_default = re.search(
        r"^ARG PYTHON_IMAGE=(\S+)", (ROOT / "services" / "Dockerfile").read_text(), re.MULTILINE
    )
    assert dockerfile_default is not None, "services/Dockerfile has no ARG PYTHON_IMAGE default"
    images = {
        "prometheus": services["prometheus"]["image"],
        "influxdb": services["influxdb"]["image"],
        "k6": services["k6"]["image"],
        "python": os.environ.get("PYTHON_IMAGE") or dockerfile_default[1],
    }
    absent = [
        image
        for image in images.values()
        if run_cli("docker", "image", "inspect", image, check=False).returncode != 0
    ]
    if absent:
        missing(
            f"image(s) not in the engine: {', '.join(absent)}. Without registry access build the "
            "substitutes (tests/docker/build-images.sh) and export tests/docker/substitutes.env "
            "(set -a; . tests/docker/substitutes.env; set +a); with it, pull them"
        )
    return Engine(version, int(details["NCPU"]), images)


def compose_up(services: list[str], *profiles: str) -> None:
    """`docker compose <profiles> up -d --wait <services>`; on a failure, the logs, and those services
    removed: what was up before stays up, so one failure does not take the tests after it down too."""
    up = compose(*profiles, "up", "-d", "--wait", "--wait-timeout", "240", *services, check=False)
    if up.returncode != 0:
        logs = compose(*STANDING, "logs", "--no-color", "--tail", "30", check=False).stdout
        compose(*STANDING, "rm", "--stop", "--force", "--volumes", *services, check=False)
        pytest.fail(f"docker compose up --wait failed:\n{up.stderr[-3000:]}\n{logs[-4000:]}")


# --- The engine's events, run_matrix.py as a subprocess -----------------------------------------


class EngineEvents:
    """`docker events` for the containers of one run (label protolab.run=<id>), from before it started.

    on_start(event) runs in the reader thread the moment a container starts.
    """

    def __init__(
        self, run_id: str, on_start: Callable[[dict[str, Any]], None] | None = None, host: str | None = None
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self._on_start = on_start
        self._changed = threading.Condition()
        # --since replays what happened between this call and the stream's start: nothing is missed.
        self._process = subprocess.Popen(
            [
                "docker", *(["-H", host] if host else []), "events", "--since", f"{time.time() - 1:.3f}",
                "--filter", "type=container", "--filter", f"label=protolab.run={run_id}",
                "--format", "{{json .}}",
            ],
            stdout=subprocess.PIPE, text=True, env=_compose_env(),
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            event = json.loads(line)
            if event.get("Action") == "start" and self._on_start is not None:
                self._on_start(event)
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    def wait_for(self, what: str, timeout: float, **attributes: str) -> dict[str, Any]:
        """The first event whose Action is `what` and whose labels include attributes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events:
                    labels = event["Actor"]["Attributes"]
                    if event["Action"] == what and attributes.items() <= labels.items():
                        return event
                left = deadline - time.monotonic()
                assert left > 0, f"no {what} event with {attributes} in {timeout:g}s: {self.actions()}"
                self._changed.wait(left)

    def actions(self, what: str | None = None) -> list[tuple[str, str]]:
        """(action, container name) of every event so far, or of one action."""
        with self._changed:
            return [
                (e["Action"], e["Actor"]["Attributes"].get("name", ""))
                for e in self.events
                if what is None or e["Action"] == what
            ]

    def close(self) -> None:
        if self._process.poll() is not None:
            return
        time.sleep(0.5)  # the engine's last events of the run reach the stream
        self._process.terminate()
        self._process.wait(timeout=10)
        self._reader.join(timeout=10)


@dataclass
class Run:
    """One run_matrix.py --backend docker process in its own session, as a terminal would start it."""

    out: Path
    process: subprocess.Popen[bytes]
    began: float = field(default_factory=time.time)

    @property
    def run_id(self) -> str:
        return self.out.name

    def wait(self, timeout: float = 300) -> int:
        return self.process.wait(timeout=timeout)

    def interrupt(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)  # what a Ctrl-C in the terminal sends

    def output(self) -> str:
        return (self.out.parent / f"{self.run_id}.output").read_text(errors="replace")[-5000:]


def quick_benchmark(out: Path) -> None:
    """The serialization benchmark is not under test: a quick one in place saves ~10 s per finished
    run (the report skips the benchmark when its file exists)."""
    write_json_atomic(out / "serialization.json", as_document(run_serialization(QUICK), QUICK))


def start_run(out: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f"{out.name}.output").open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
                "--backend", "docker", "--out", str(out),
                # The CA of the compose volume is copied here, not into the repository's certs/.
                "--certs", str(out.parent / "certs"), *args,
            ],
            cwd=ROOT, env={**_compose_env(), **(env or {})},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return Run(out, process)


def results(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "scenarios").glob("*.json")}


def unique_run_id(kind: str) -> str:
    return f"docker-{kind}-{uuid.uuid4().hex[:8]}"


def get_json(url: str, timeout: float = 10) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    with opener.open(url, timeout=timeout) as response:
        return json.load(response)


def profiles() -> dict[str, tuple[float, int]]:
    """matrix.toml's profiles as written: name -> (CPUs, memory bytes)."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    table = tomllib.loads((ROOT / "matrix.toml").read_text())["profiles"]
    parsed = {}
    for name, profile in table.items():
        memory = re.fullmatch(r"(\d+)([kmg])", profile["memory"].lower())
        assert memory is not None, profile
        parsed[name] = (float(profile["cpus"]), int(memory[1]) * units[memory[2]])
    return parsed
