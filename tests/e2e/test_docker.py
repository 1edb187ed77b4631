"""End to end under a real Docker engine (issue 12): docker-compose.yml built and up, then
run_matrix.py --backend docker, checked from outside through the engine, Prometheus and InfluxDB.

Selected only with PROTOLAB_DOCKER_TESTS=1 (tests/conftest.py); CI sets it and exports
tests/docker/substitutes.env, whose images stand in for the official ones (tests/docker/README.md).
Grafana and k6 (profile "tools") are not started: Grafana has no substitute, the runner starts its
own k6 containers. A missing engine, Compose or image fails the tests and says what is missing.
Compose comes up once for the module as a plain `up` starts it; the standing services (profile
"services") come up by hand in one test and go again, so the runs see only what the runner needs.
The last test takes the lab down and checks that nothing is left.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labrunner.backends import docker_names, docker_network_helper
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization

from tests.support import (
    AFTER_SLOW,
    ALL_TARGETS,
    ROOT,
    SLOW,
    SLOW_STOP_TARGETS,
    seed_keeping_matrix_order,
    slow_stop_seed,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

COMPOSE_FILE = ROOT / "docker-compose.yml"
PROJECT = "protolab"  # docker-compose.yml's `name:`
NOT_STARTED = {"grafana", "k6"}  # no substitute for Grafana; k6 is the runner's
STANDING = ("--profile", "services")  # the five services, up only when asked for
MIN_ENGINE = (25, 0)  # healthcheck start_interval
PROMETHEUS = "http://127.0.0.1:9090"
INFLUXDB = "http://127.0.0.1:8086"
# Every service compose starts here and how it answers on its published loopback port: what a
# plain `up -d` starts (but Grafana), then the standing services.
LAB_ANSWERS = {
    "prometheus": (9090, "http", "/-/ready"),
    "influxdb": (8086, "http", "/ping"),
}
STANDING_ANSWERS = {
    "rest-aiohttp": (8081, "http", "/healthz"),
    "rest-quart": (8082, "http", "/healthz"),
    "grpc-aio": (50051, "grpc", ""),
    "rest-granian": (8083, "http", "/healthz"),
    "grpc-grpclib": (50052, "grpc", ""),
}
ONE_SHOTS = {"certs"}  # must have exited 0
# The main run: the ci preset (small profile) with a shorter measurement.
MAIN_SELECTION = ("--preset", "ci", "--duration", "2s", "--warmup", "1s")
# The interrupted runs: two fast scenarios, no warm-up, nothing sent to Prometheus or InfluxDB.
FIRST, SECOND = "aiohttp-h1.small.c100.closed.r1", "grpc.small.c100.closed.r1"
# FIRST first: a seed that keeps the matrix's order.
IN_ORDER = seed_keeping_matrix_order(
    expand(load_matrix(ROOT / "matrix.toml"), "docker", "ci", Overrides(targets=("aiohttp-h1", "grpc")))
)
SHORT_SELECTION = (
    "--preset", "ci", "--target", "aiohttp-h1,grpc", "--duration", "2s", "--warmup", "0", "--seed", IN_ORDER,
)  # fmt: skip
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
MANAGED = f"{docker_names.MANAGED_LABEL}=true"


# --- The engine and compose -----------------------------------------------------------------------


def _compose_env() -> dict[str, str]:
    """The environment with the image variables CI exports; none of a user's SUT_* or COMPOSE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUT_", "COMPOSE_"))}
    # Grafana is not started, but compose will not read the file without its password.
    env.setdefault("GRAFANA_ADMIN_PASSWORD", "unused-grafana-is-not-started")
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


def _missing(what: str) -> None:
    pytest.fail(f"docker tests (PROTOLAB_DOCKER_TESTS=1): {what}", pytrace=False)


def preflight() -> Engine:
    """The engine, Compose v2 and every image the run needs, or a failure that names what is missing."""
    if shutil.which("docker") is None:
        _missing(
            "no `docker` command on PATH; install Docker Engine >= 25 with Compose v2 "
            "(CI: .ci/docker-engine.sh install)"
        )
    info = run_cli("docker", "info", "--format", "{{json .}}", check=False, timeout=30)
    if info.returncode != 0:
        _missing(
            f"no Docker engine answers `docker info` ({info.stderr.strip()[-500:]}); "
            "start it (CI: .ci/docker-engine.sh start)"
        )
    details = json.loads(info.stdout)
    version = details.get("ServerVersion", "")
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) < MIN_ENGINE:
        _missing(f"Docker engine {version} is older than 25.0 (compose's healthcheck start_interval)")
    if run_cli("docker", "compose", "version", check=False).returncode != 0:
        _missing("`docker compose` (the Compose v2 plugin) is not installed")
    config = compose("--profile", "tools", "config", "--format", "json", timeout=60, check=False)
    if config.returncode != 0:
        _missing(f"`docker compose config` fails: {config.stderr.strip()[-1000:]}")
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
        _missing(
            f"image(s) not in the engine: {', '.join(absent)}. Without registry access build the "
            "substitutes (tests/docker/build-images.sh) and export tests/docker/substitutes.env "
            "(set -a; . tests/docker/substitutes.env; set +a); with it, pull them"
        )
    return Engine(version, int(details["NCPU"]), images)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return preflight()


def _up(*args: str) -> None:
    """`docker compose <args> up -d --wait`; on a failure, the logs and the lab taken down."""
    up = compose(*args, check=False)
    if up.returncode != 0:
        logs = compose(*STANDING, "logs", "--no-color", "--tail", "30", check=False).stdout
        compose(*STANDING, "down", "-v", "--remove-orphans", check=False)
        pytest.fail(f"docker compose up --wait failed:\n{up.stderr[-3000:]}\n{logs[-4000:]}")


@pytest.fixture(scope="module")
def lab(engine: Engine) -> Iterator[list[str]]:
    """The README's commands: `docker compose --profile services build`, then `up -d --wait` of what
    a plain `up -d` starts, but Grafana."""
    started = [s for s in compose("config", "--services").stdout.split() if s not in NOT_STARTED]
    compose(*STANDING, "down", "-v", "--remove-orphans")  # whatever an earlier session left
    compose(*STANDING, "build", "--quiet", timeout=900)
    _up("up", "-d", "--wait", "--wait-timeout", "240", *started)
    yield started
    compose(*STANDING, "down", "-v", "--remove-orphans", check=False)  # a no-op when the last test ran


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
                sys.executable, "scripts/run_matrix.py", "--backend", "docker", "--out", str(out),
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


# --- The main run: the ci preset, every target, containers inspected while they run ---------------


@dataclass
class MainRun:
    run: Run
    exit_code: int
    results: dict[str, dict[str, Any]]
    inspected: dict[str, dict[str, Any]]  # container name -> `docker inspect` as it started
    measured: dict[str, dict[str, Any]]  # scenario -> its service's `docker inspect` as a k6 started
    began: float


@pytest.fixture(scope="module")
def main_run(lab: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[MainRun]:
    out = tmp_path_factory.mktemp("docker") / unique_run_id("ci")
    out.mkdir()
    quick_benchmark(out)
    inspected: dict[str, dict[str, Any]] = {}
    measured: dict[str, dict[str, Any]] = {}

    def inspect(event: dict[str, Any]) -> None:
        found = run_cli("docker", "inspect", event["Actor"]["ID"], check=False)
        if found.returncode == 0:  # a k6 container may be gone already
            container = json.loads(found.stdout)[0]
            inspected[container["Name"].lstrip("/")] = container
        labels = event["Actor"]["Attributes"]
        if labels["protolab.role"] == "k6":  # the warm-up's k6 and the measured one's
            service = run_cli(
                "docker", "ps", "-q", "--filter", f"label=protolab.run={labels['protolab.run']}",
                "--filter", f"label=protolab.scenario={labels['protolab.scenario']}",
                "--filter", "label=protolab.role=service",
            ).stdout.split()  # fmt: skip
            if service:
                measured[labels["protolab.scenario"]] = json.loads(
                    run_cli("docker", "inspect", *service).stdout
                )[0]

    events = EngineEvents(out.name, on_start=inspect)
    began = time.time()
    run = start_run(
        out, *MAIN_SELECTION,
        "--influxdb", INFLUXDB, "--prometheus", PROMETHEUS,
        # compose mounts ./prometheus into its Prometheus, which reads file_sd from targets/
        "--prometheus-targets", str(ROOT / "prometheus" / "targets"),
    )  # fmt: skip
    try:
        exit_code = run.wait(timeout=420)
    finally:
        if run.process.poll() is None:
            run.interrupt()
            run.wait(timeout=60)
        events.close()
    yield MainRun(run, exit_code, results(out), inspected, measured, began)


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
    _up(*STANDING, "up", "-d", "--wait", "--wait-timeout", "240", *standing)
    try:
        states = _states()
        assert set(states) == set(lab) | set(standing), states.keys()
        _check_answers({**LAB_ANSWERS, **STANDING_ANSWERS}, states)
    finally:
        # The runs below see the lab as a plain `up -d` leaves it: nothing idles beside them.
        compose(*STANDING, "rm", "--stop", "--force", *standing)
    assert set(_states()) == set(lab)


def test_the_ci_preset_runs_every_target_under_docker_without_errors(main_run: MainRun) -> None:
    assert main_run.exit_code == EXIT_OK, main_run.run.output()
    assert sorted(r["scenario"]["target"] for r in main_run.results.values()) == sorted(ALL_TARGETS)
    for scenario, result in main_run.results.items():
        assert result["status"] == "ok", (scenario, result["failure"])
        assert result["backend"] == "docker" and result["service"]["limits"] == "docker", scenario
        assert result["verification"]["ok"], scenario
        metrics = result["k6"]["metrics"]
        assert metrics["requests"] > 0 and metrics["errors"] == 0, (scenario, metrics)
    manifest = json.loads((main_run.run.out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True
    assert manifest["backend"]["name"] == "docker"


def test_each_scenario_container_has_its_profiles_limits(main_run: MainRun, engine: Engine) -> None:
    table = profiles()
    nofile = int(os.environ.get("SERVICE_NOFILE") or docker_names.NOFILE)
    roles: dict[tuple[str, str], dict[str, Any]] = {}
    for container in main_run.inspected.values():
        labels = container["Config"]["Labels"]
        roles[(labels["protolab.scenario"], labels["protolab.role"])] = container
    assert {s for s, _ in roles} == set(main_run.results), roles.keys()
    for scenario, result in main_run.results.items():
        cpus, memory = table[result["scenario"]["profile"]["name"]]
        service, k6 = roles[(scenario, "service")], roles[(scenario, "k6")]
        host, measured = service["HostConfig"], main_run.measured[scenario]["HostConfig"]
        print(  # shown with -s, and with a failure
            f"{scenario}: CpuQuota {host['CpuQuota']} then {measured['CpuQuota']} per CpuPeriod "
            f"{measured['CpuPeriod']}, Memory {host['Memory']} MemorySwap {host['MemorySwap']} cpuset "
            f"{host['CpusetCpus']}, k6 cpuset {k6['HostConfig']['CpusetCpus']}"
        )
        # It starts at its whole CPUs' quota and is measured at its profile's, from the warm-up on.
        assert (host["CpuPeriod"], host["CpuQuota"]) == (100_000, math.ceil(cpus) * 100_000), scenario
        assert (measured["CpuPeriod"], measured["CpuQuota"]) == (100_000, round(cpus * 100_000)), scenario
        assert host["Memory"] == host["MemorySwap"] == memory, (scenario, host["Memory"], host["MemorySwap"])
        service_cpus = host["CpusetCpus"].split(",")
        k6_cpus = k6["HostConfig"]["CpusetCpus"].split(",")
        # ceil(cpus) CPUs for the service, the others for k6 (shared only when there are no others)
        assert len(service_cpus) == math.ceil(cpus), (scenario, host["CpusetCpus"])
        if engine.ncpu > math.ceil(cpus):
            others = {str(c) for c in range(engine.ncpu)} - set(service_cpus)
            assert set(k6_cpus) == others, (scenario, k6_cpus)
        # what the engine enforces is what the result says
        assert service_cpus == [str(c) for c in result["service"]["service_cpus"]], scenario
        assert k6_cpus == [str(c) for c in result["service"]["k6_cpus"]], scenario
        assert k6["Config"]["Image"] == os.environ.get("K6_IMAGE", docker_names.K6_IMAGE), scenario
        for container in (service, k6):
            assert [(u["Name"], u["Soft"], u["Hard"]) for u in container["HostConfig"]["Ulimits"]] == [
                ("nofile", nofile, nofile)
            ], scenario


def test_prometheus_scraped_every_scenario_container(main_run: MainRun) -> None:
    window = math.ceil(time.time() - main_run.began) + 10
    query = (
        f'max by (scenario, target, profile) (max_over_time(up{{run="{main_run.run.run_id}"}}[{window}s]))'
    )
    answer = get_json(f"{PROMETHEUS}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
    series = {s["metric"]["scenario"]: s for s in answer["data"]["result"]}
    print(f"{query}: {sorted((k, s['value'][1]) for k, s in series.items())}")
    assert set(series) == set(main_run.results), series.keys()
    for scenario, s in series.items():
        wanted = main_run.results[scenario]["scenario"]
        assert s["value"][1] == "1", (scenario, s)
        assert s["metric"]["target"] == wanted["target"], (scenario, s)
        assert s["metric"]["profile"] == wanted["profile"]["name"], (scenario, s)


def test_influxdb_holds_as_many_requests_per_scenario_as_k6_counted(main_run: MainRun) -> None:
    query = (
        f'SELECT count("value") FROM "protolab_reqs" WHERE "run" = \'{main_run.run.run_id}\' '
        'GROUP BY "scenario"'
    )
    answer = get_json(f"{INFLUXDB}/query?{urllib.parse.urlencode({'db': 'myk6db', 'q': query})}")
    counted = {s["tags"]["scenario"]: s["values"][0][1] for s in answer["results"][0].get("series", [])}
    expected = {scenario: r["k6"]["metrics"]["requests"] for scenario, r in main_run.results.items()}
    print(f"protolab_reqs per scenario, InfluxDB: {sorted(counted.items())}; k6: {sorted(expected.items())}")
    assert counted == expected


def test_the_floor_servers_run_in_their_stacks_images(lab: list[str], tmp_path: Path) -> None:
    out = tmp_path / unique_run_id("floor")
    quick_benchmark(out)
    selection = ("--preset", "floor", "--target", "floor-aiohttp-h1,floor-grpc", "--response-model", "build")
    run = start_run(out, *selection, "--repeats", "1", "--duration", "1s", "--warmup", "0", *QUIET)
    assert run.wait(timeout=180) == EXIT_OK, run.output()
    found = results(out)
    assert sorted(r["scenario"]["target"] for r in found.values()) == ["floor-aiohttp-h1", "floor-grpc"]
    for scenario, result in found.items():
        assert result["status"] == "ok" and result["verification"]["ok"], (scenario, result["failure"])
        assert result["k6"]["metrics"]["requests"] > 0 and result["k6"]["metrics"]["errors"] == 0, scenario


def test_a_profile_larger_than_the_engine_is_refused_before_any_container(
    lab: list[str], engine: Engine, tmp_path: Path
) -> None:
    profile_args: tuple[str, ...] = ("--profile", "p2")
    cpus, _ = profiles()["p2"]
    if cpus <= engine.ncpu:  # an engine with 4 CPUs or more: a profile that cannot fit there
        cpus = float(engine.ncpu * 2)
        matrix = tmp_path / "matrix.toml"
        extra = f'\n[profiles.p2x]\ncpus = {cpus}\nmemory = "1g"\n'
        matrix.write_text((ROOT / "matrix.toml").read_text() + extra)
        profile_args = ("--matrix", str(matrix), "--profile", "p2x")
    out = tmp_path / unique_run_id("toolarge")
    quick_benchmark(out)
    selection = ("--preset", "ci", "--target", "grpc", "--duration", "1s", "--warmup", "0")
    run = start_run(out, *selection, *profile_args, *QUIET)
    events = EngineEvents(run.run_id)
    try:
        exit_code = run.wait(timeout=120)
    finally:
        events.close()
    assert exit_code == EXIT_FAILED, run.output()
    message = f"profile {profile_args[-1]} asks for {cpus:g} CPUs; the Docker engine has {engine.ncpu}"
    [result] = results(out).values()
    assert (result["failure"]["phase"], result["failure"]["message"]) == ("start", message)
    assert f"FAILED in start: {message}" in run.output()
    assert events.actions() == [], "a container was created for a profile that cannot fit"


class HoldingProxy:
    """The engine's API socket relayed byte for byte, except that the engine's answer to the first
    `POST .../containers/create` is held back until release(): a Ctrl-C sent meanwhile lands inside
    the runner's containers.create call, after the engine has made the container (the window of
    issue 12's leak, which a Ctrl-C timed from outside hits only by chance)."""

    def __init__(self, path: Path, upstream: str) -> None:
        self.path, self._upstream = path, upstream
        self.holding = threading.Event()  # set once a create's answer is held
        self.held_status = b""  # the status line of that answer
        self._release = threading.Event()
        self._armed = True
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self._release.set()
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self._upstream)
            hold = threading.Event()  # this connection's next answer is held
            threading.Thread(target=self._requests, args=(client, engine, hold), daemon=True).start()
            threading.Thread(target=self._answers, args=(engine, client, hold), daemon=True).start()

    def _requests(self, client: socket.socket, engine: socket.socket, hold: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if self._armed and re.match(rb"POST /\S*containers/create", data):
                    self._armed = False
                    hold.set()  # before the request reaches the engine, so before its answer
                engine.sendall(data)
        except OSError:
            pass
        finally:
            engine.close()

    def _answers(self, engine: socket.socket, client: socket.socket, hold: threading.Event) -> None:
        try:
            while data := engine.recv(65536):
                if hold.is_set():
                    hold.clear()
                    self.held_status = data.split(b"\r\n", 1)[0]
                    self.holding.set()
                    self._release.wait(120)
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()


def engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert host.startswith("unix://"), f"the create interrupt relays a unix socket, not {host}"
    return host.removeprefix("unix://")


def test_ctrl_c_during_a_create_and_while_k6_measures_leaves_no_container_and_resume_finishes(
    lab: list[str], tmp_path: Path
) -> None:
    out = tmp_path / unique_run_id("ctrlc")
    events = EngineEvents(out.name)
    try:
        interrupt_and_resume(out, events)
    finally:
        events.close()


def interrupt_and_resume(out: Path, events: EngineEvents) -> None:
    # 1. Ctrl-C while the runner waits for the engine's answer to the first service's create.
    # A short path: a unix socket's may not exceed 107 bytes, and pytest's tmp_path can.
    socket_dir = Path(tempfile.mkdtemp(prefix="protolab-", dir="/tmp"))
    proxy = HoldingProxy(socket_dir / "engine.sock", engine_socket())
    run = start_run(out, *SHORT_SELECTION, *QUIET, env={"DOCKER_HOST": f"unix://{proxy.path}"})
    try:
        assert proxy.holding.wait(90), "the runner never created a container\n" + run.output()
        created = events.wait_for("create", 10, **{"protolab.scenario": FIRST, "protolab.role": "service"})
        run.interrupt()
        assert run.wait(timeout=90) == EXIT_INTERRUPTED, run.output()
    finally:
        proxy.release()
        shutil.rmtree(socket_dir)
    assert proxy.held_status.startswith(b"HTTP/1.1 201"), proxy.held_status  # the engine made it
    assert f"--resume --run-id {run.run_id}" in run.output()
    assert managed_containers() == []
    events.wait_for("destroy", 10, name=created["Actor"]["Attributes"]["name"])
    print(f"held create answer {proxy.held_status!r}; events after the Ctrl-C: {events.actions()}")
    assert results(out) == {}

    # 2. --resume, and Ctrl-C a second into k6's measured run of the second scenario.
    resumed = start_run(out, *SHORT_SELECTION, *QUIET, "--resume")
    events.wait_for("start", 120, **{"protolab.scenario": SECOND, "protolab.role": "k6"})
    time.sleep(1.0)
    resumed.interrupt()
    assert resumed.wait(timeout=90) == EXIT_INTERRUPTED, resumed.output()
    assert not (out / "k6" / f"{SECOND}.measure.json").exists(), "k6 finished before the Ctrl-C"
    assert managed_containers() == []
    done = results(out)
    assert set(done) == {FIRST} and done[FIRST]["status"] == "ok", done.keys()
    first_result = (out / "scenarios" / f"{FIRST}.json").read_bytes()

    # 3. --resume finishes the run.
    quick_benchmark(out)
    final = start_run(out, *SHORT_SELECTION, *QUIET, "--resume")
    assert final.wait(timeout=180) == EXIT_OK, final.output()
    events.close()
    assert f"{FIRST}: ok in an earlier session, skipped" in final.output()
    assert (out / "scenarios" / f"{FIRST}.json").read_bytes() == first_result, "a finished result was rerun"
    done = results(out)
    assert {s: r["status"] for s, r in done.items()} == {FIRST: "ok", SECOND: "ok"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["all_ok"] is True and len(manifest["resumed_at"]) == 2
    assert managed_containers() == []
    created_names = {name for _, name in events.actions("create")}
    assert created_names == {name for _, name in events.actions("destroy")}, events.actions()


def test_ctrl_c_while_one_scenario_finishes_and_the_next_starts_then_again_leaves_no_container(
    lab: list[str], tmp_path: Path
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text() + SLOW_STOP_TARGETS)
    out = tmp_path / unique_run_id("overlap")
    selection = ("--matrix", str(matrix), "--preset", "slow-stop", "--seed", slow_stop_seed())
    events = EngineEvents(out.name)
    try:
        run = start_run(out, *selection, *QUIET)
        # The overlap window: the second scenario has started, the first one (draining 3 s on its
        # stop, on the finisher's own client) is not yet reported.
        deadline = time.monotonic() + 120
        while f"[2/2] {AFTER_SLOW}: starting" not in run.output():
            assert time.monotonic() < deadline and run.process.poll() is None, run.output()
            time.sleep(0.05)
        assert f"[1/2] {SLOW}: ok" not in run.output(), "the first scenario finished before the window"
        run.interrupt()
        time.sleep(0.3)
        run.interrupt()  # while the run stops
        assert run.wait(timeout=90) == EXIT_INTERRUPTED, run.output()
        assert f"[1/2] {SLOW}: ok" in run.output(), run.output()  # its finish completed, and was said
        assert managed_containers() == []
        assert {s: r["status"] for s, r in results(out).items()} == {SLOW: "ok"}
        quick_benchmark(out)
        final = start_run(out, *selection, *QUIET, "--resume")
        assert final.wait(timeout=180) == EXIT_OK, final.output()
    finally:
        events.close()
    assert {s: r["status"] for s, r in results(out).items()} == {SLOW: "ok", AFTER_SLOW: "ok"}
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert managed_containers() == []
    assert {name for _, name in events.actions("create")} == {name for _, name in events.actions("destroy")}


# --- Network conditions: tc from a helper in the service's namespace, never NET_ADMIN for the service


def kernel_has_netem() -> bool:
    """Whether the engine's kernel takes a netem qdisc (asked in a throwaway namespace)."""
    tried = run_cli(
        "docker", "run", "--rm", "--network", "none", "--cap-drop", "ALL", "--cap-add", "NET_ADMIN",
        docker_network_helper.NETWORK_HELPER_IMAGE, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
        "delay", "1ms", check=False,
    )  # fmt: skip
    assert tried.returncode == 0 or docker_network_helper.NO_NETEM in tried.stderr, tried.stderr
    return tried.returncode == 0


class QdiscWatch:
    """`tc qdisc show` inside a service container's network namespace (from a helper without any
    capability) until it shows the emulation or the container is gone: what the service's packets pass."""

    def __init__(self, container_id: str) -> None:
        self.seen = ""
        self._id = container_id
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 60
        # Until the ifb device has its qdisc too: the device exists (with the default pfifo_fast)
        # a moment before the helper's last command puts the emulation on it.
        while time.monotonic() < deadline and not re.search(r"qdisc (tbf|netem) \S+ dev plab-ifb", self.seen):
            shown = run_cli(
                "docker", "run", "--rm", "--network", f"container:{self._id}", "--cap-drop", "ALL",
                docker_network_helper.NETWORK_HELPER_IMAGE, "tc", "qdisc", "show", check=False, timeout=30,
            )  # fmt: skip
            if shown.returncode != 0 and "No such container" in shown.stderr:
                return
            self.seen = shown.stdout if "qdisc tbf" in shown.stdout else self.seen
            time.sleep(0.5)

    def join(self) -> str:
        self._thread.join(timeout=90)
        return self.seen


def test_a_rate_only_network_is_emulated_without_net_admin_for_the_service_and_netem_says_what_it_needs(
    lab: list[str], tmp_path: Path
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text() + '\n[networks.narrow-rate]\nrate = "10mbit"\n')
    out = tmp_path / unique_run_id("network")
    quick_benchmark(out)
    wan, narrow = "aiohttp-h1.small.c100.closed.wan.r1", "aiohttp-h1.small.c100.closed.narrow-rate.r1"
    services: dict[str, dict[str, Any]] = {}  # scenario -> `docker inspect` of its service container
    watches: dict[str, QdiscWatch] = {}

    def on_start(event: dict[str, Any]) -> None:
        labels = event["Actor"]["Attributes"]
        if labels.get("protolab.role") != "service" or labels.get("protolab.scenario") != narrow:
            return
        found = run_cli("docker", "inspect", event["Actor"]["ID"], check=False)
        if found.returncode == 0:
            services[labels["protolab.scenario"]] = json.loads(found.stdout)[0]
        watches[labels["protolab.scenario"]] = QdiscWatch(event["Actor"]["ID"])

    events = EngineEvents(out.name, on_start=on_start)
    # wan first (the matrix's order), so the run is seen to go on after its failure.
    networks = Overrides(targets=("aiohttp-h1",), networks=("wan", "narrow-rate"))
    in_order = seed_keeping_matrix_order(expand(load_matrix(matrix), "docker", "ci", networks))
    run = start_run(
        out, "--matrix", str(matrix), "--preset", "ci", "--target", "aiohttp-h1",
        "--network", "wan,narrow-rate", "--duration", "3s", "--warmup", "1s", "--repeats", "1",
        "--seed", in_order, *QUIET,
    )  # fmt: skip
    try:
        exit_code = run.wait(timeout=400)
    finally:
        events.close()
    found = results(out)
    assert set(found) == {wan, narrow}, run.output()

    # The rate-only profile: tbf on the service's interface (egress) and on its ifb (ingress),
    # put there by a helper; the link measured within 10% before k6 measured through it.
    result = found[narrow]
    assert result["status"] == "ok", result["failure"]
    network = result["network"]
    assert (network["profile"], network["emulator"]) == ("narrow-rate", "tbf")
    assert abs(network["measured_rate_bps"] - 10e6) <= 0.1 * 10e6, network
    assert 0 < network["measured_rtt_s"] < 0.00025, network  # no delay: within the RTT floor
    container = services[narrow]
    assert network["service_address"] == container["NetworkSettings"]["Networks"]["protolab"]["IPAddress"]
    # The service itself never had NET_ADMIN: no capability added, all dropped.
    assert not container["HostConfig"]["CapAdd"], container["HostConfig"]["CapAdd"]
    assert container["HostConfig"]["CapDrop"] == ["ALL"]
    qdiscs = watches[narrow].join()
    assert re.search(r"qdisc tbf \S+ dev eth0 root .*rate 10Mbit", qdiscs), qdiscs
    assert re.search(r"qdisc tbf \S+ dev plab-ifb root .*rate 10Mbit", qdiscs), qdiscs
    assert re.search(r"qdisc ingress ffff: dev eth0", qdiscs), qdiscs
    # k6's own traffic went through the link: the responses' bytes fit in 10 Mbit/s.
    received_bps = result["k6"]["metrics"]["data_received_bytes_per_second"] * 8
    assert 5e6 < received_bps <= 10e6, received_bps
    helpers = {name.removeprefix(container["Name"].lstrip("/")) for _, name in events.actions("create")}
    assert {"-tc", "-link-serve", "-link-probe"} <= helpers, helpers

    # The netem profile: on a kernel without sch_netem (this CI machine's) it fails saying so,
    # and the next scenario still ran; where netem exists it is verified like the rate.
    if kernel_has_netem():
        assert found[wan]["status"] == "ok", found[wan]["failure"]
        assert found[wan]["network"]["emulator"] == "netem"
        assert abs(found[wan]["network"]["measured_rtt_s"] - 0.050) <= 0.005, found[wan]["network"]
        assert exit_code == EXIT_OK, run.output()
    else:
        failure = found[wan]["failure"]
        assert failure["phase"] == "network", failure
        assert failure["message"] == docker_network_helper.no_netem_message(
            load_matrix(matrix).networks["wan"]
        )
        assert "sch_netem" in failure["message"] and "--backend local" in failure["message"]
        assert found[wan]["finished_at"] <= result["started_at"]  # the run went on after it
        assert exit_code == EXIT_FAILED, run.output()
        assert "FAILED in network: network wan: the Docker engine's kernel has no netem" in run.output()
    assert managed_containers() == []
    created = {name for _, name in events.actions("create")}
    assert created == {name for _, name in events.actions("destroy")}, events.actions()


# --- Two engines as two hosts: the service on the lab's engine, k6's instances on another -------


def load_engine() -> str:
    """The second engine CI starts as the load host (its own socket, data root and bridge)."""
    url = os.environ.get("PROTOLAB_LOAD_ENGINE", "")
    if not url:
        _missing(
            "PROTOLAB_LOAD_ENGINE is not set: the two-engine test needs a second Docker engine as "
            "the load host (CI: .ci/docker-engine.sh start-load)"
        )
    info = run_cli("docker", "-H", url, "info", "--format", "{{.ServerVersion}} {{.NCPU}}", check=False)
    if info.returncode != 0:
        _missing(f"the load engine {url} does not answer `docker info` ({info.stderr.strip()[-300:]})")
    return url


def test_the_service_on_one_engine_and_two_k6_instances_on_another(lab: list[str], tmp_path: Path) -> None:
    load = load_engine()
    out = tmp_path / unique_run_id("engines")
    quick_benchmark(out)
    run = start_run(
        out, "--preset", "ci", "--target", "aiohttp-h1-tls,grpc-tls", "--duration", "3s", "--warmup", "1s",
        "--load-engine", load, "--k6-instances", "2",
        "--influxdb", INFLUXDB, "--prometheus", PROMETHEUS,
        "--prometheus-targets", str(ROOT / "prometheus" / "targets"),
    )  # fmt: skip
    service_events, load_events = EngineEvents(run.run_id), EngineEvents(run.run_id, host=load)
    try:
        exit_code = run.wait(timeout=300)
    finally:
        service_events.close()
        load_events.close()
    assert exit_code == EXIT_OK, run.output()
    vus = load_matrix(ROOT / "matrix.toml").load_models["closed"].vus
    found = results(out)
    assert len(found) == 2
    for scenario, result in found.items():
        k6_section, instances = result["k6"], result["k6"]["instances"]
        assert [i["placement"] for i in instances] == [f"engine {load} CPU 0", f"engine {load} CPU 1"]
        merged = k6_section["metrics"]
        assert merged["requests"] == sum(i["metrics"]["requests"] for i in instances) > 0
        assert merged["errors"] == sum(i["metrics"]["errors"] for i in instances) == 0
        assert sum(i["metrics"]["vus_max"] for i in instances) == vus  # the load model's, split
        # Percentiles over every sample both instances copied out of their containers.
        samples = [
            float(line)
            for index in (1, 2)
            for line in (out / "k6" / f"{scenario}.measure.k6-{index}.latency_ms.txt").read_text().split()
        ]
        # One sample per request k6 did not decode: the clock's (k6/lib/common.js).
        assert len(samples) == merged["latency_count"] and 0 < len(samples) < merged["requests"]
        ordered = sorted(samples)
        for key, quantile in (("p50", 0.50), ("p99", 0.99)):
            rank = quantile * (len(ordered) - 1)  # linear interpolation, as k6 and numpy compute it
            low = ordered[math.floor(rank)]
            expected = low + (ordered[math.ceil(rank)] - low) * (rank - math.floor(rank))
            assert merged["latency_ms"][key] == pytest.approx(expected, rel=1e-9)
        # Each instance's InfluxDB points, tagged with its index, hold the requests it counted.
        query = (
            f'SELECT count("value") FROM "protolab_reqs" WHERE "run" = \'{run.run_id}\' '
            f'AND "scenario" = \'{scenario}\' GROUP BY "k6_instance"'
        )
        answer = get_json(f"{INFLUXDB}/query?{urllib.parse.urlencode({'db': 'myk6db', 'q': query})}")
        counted = {s["tags"]["k6_instance"]: s["values"][0][1] for s in answer["results"][0]["series"]}
        assert counted == {str(i["index"]): i["metrics"]["requests"] for i in instances}
        assert result["host"]["reason"].startswith(f"k6 runs on load engine(s) {load}")
    # k6's containers ran on the load engine only, the services on the lab's; none is left.
    on_load = [name for _, name in load_events.actions("start")]
    # Two scenarios, each a warm-up and a measured run, each two instances.
    assert len(on_load) == 8 and all(re.search(r"-k6-[12]$", name) for name in on_load), on_load
    assert all("-k6" not in name for _, name in service_events.actions("start")), service_events.actions()
    assert managed_containers() == []
    assert docker("-H", load, "ps", "-aq", "--filter", f"label={MANAGED}") == ""


def test_an_engine_that_does_not_answer_fails_the_run_at_start_naming_it(
    lab: list[str], tmp_path: Path
) -> None:
    silent = f"unix://{tmp_path}/no-engine.sock"
    out = tmp_path / unique_run_id("silent")
    run = start_run(out, "--preset", "ci", "--target", "grpc", "--load-engine", silent, *QUIET)
    assert run.wait(timeout=60) == 2
    assert f"error: --backend docker: load engine {silent} did not answer" in run.output()
    assert not (out / "scenarios").exists()


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
