"""The docker backend on a thin fake client: container parameters, cleanup, usage, auto selection."""

import contextlib
import dataclasses
import io
import json
import os
import re
import socket
import stat
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import docker
import pytest
from docker.errors import DockerException, ImageNotFound, NotFound
from docker.types import Ulimit
from labrunner import backends, cli
from labrunner.backends import docker_engine
from labrunner.backends.base import BackendSettings, BackendUnavailable, ScenarioFailed
from labrunner.backends.docker_engine import DockerBackend, StatsSnapshot, UsageWindow
from labrunner.model.matrix import Overrides, Plan, Scenario, expand, load_matrix
from labrunner.network import docker_probe
from labrunner.network.profiles import NetworkProfile
from labrunner.run import k6, runner

from tests.compose_file import compose
from tests.support import ROOT

COMPOSE = compose()  # with the defaults a user gets
MATRIX = load_matrix(ROOT / "matrix.toml")
RUN_ID = "run1"
SERVICE_IP = "172.18.0.9"
MEMORY_PEAK = 123_456_789


def compose_images() -> dict[str, list[str]]:
    """Image name -> Config.Env, as `docker compose --profile services build` makes them (build args)."""
    images = {COMPOSE["services"]["k6"]["image"]: []}
    for service in COMPOSE["services"].values():
        args = service.get("build", {}).get("args", {})
        if "SERVICE" in args:
            images[service["image"]] = [f"PORT={args['PORT']}", f"METRICS_PORT={args['METRICS_PORT']}"]
    return images


def docker_stats(cpu_s: float, periods: int, throttled: int, throttled_s: float, **memory: int) -> dict:
    return {
        "cpu_stats": {
            "cpu_usage": {"total_usage": round(cpu_s * 1e9)},
            "throttling_data": {
                "periods": periods,
                "throttled_periods": throttled,
                "throttled_time": round(throttled_s * 1e9),
            },
        },
        "memory_stats": memory,
    }


# --- A thin fake of the docker client: records calls, behaves only as far as the tests assert --


class FakeContainer:
    def __init__(self, client: "FakeDocker", params: dict[str, Any]) -> None:
        self.client, self.params, self.name = client, params, params["name"]
        self.id = f"id-{self.name}"
        self.role = params["labels"].get("protolab.role")
        # A network helper's exit code and output, by its kind (the name's last part).
        kind = self.name.rpartition("-link-")[2] if "-link-" in self.name else self.name.rpartition("-")[2]
        self.outcome = client.helper_outcomes.get(kind, (0, b"")) if self.role == "network" else (0, b"")
        # A k6 container runs while it has samples left; a stopped container reports no counters.
        self.samples = client.k6_stats.pop(0) if self.role == "k6" and client.k6_stats else []
        self.attrs: dict[str, Any] = {"State": {"Status": "created", "ExitCode": 0}, "NetworkSettings": {}}

    @property
    def status(self) -> str:
        return self.attrs["State"]["Status"]

    @property
    def ports(self) -> dict[str, Any]:
        return self.attrs["NetworkSettings"].get("Ports", {})

    def start(self) -> None:
        self.client.calls.append(("start", self.name))
        if self.role == "network":
            serving = self.name.endswith("-link-serve")
            self.attrs["State"] = {"Status": "running" if serving else "exited", "ExitCode": self.outcome[0]}
            return
        if self.role == "k6":
            self.client.on_k6_start(self)
        exited = self.role == "service" and not self.client.service_listens
        self.attrs["State"] = {"Status": "exited" if exited else "running", "ExitCode": 1 if exited else 0}
        self.attrs["NetworkSettings"] = {
            "Ports": {
                port: [{"HostIp": host_ip, "HostPort": str(self.client.host_port)}]
                for port, (host_ip, _) in self.params.get("ports", {}).items()
            },
            "Networks": {"protolab": {"IPAddress": SERVICE_IP}},
        }

    def reload(self) -> None:
        if self.role == "k6" and not self.samples:
            self.attrs["State"]["Status"] = "exited"

    def stats(self, stream: bool, one_shot: bool) -> dict:
        assert (stream, one_shot) == (False, True)
        if self.role == "k6":
            return self.samples.pop(0) if self.samples else {}
        return self.client.service_stats.pop(0)

    def logs(self, stdout: bool, stderr: bool, tail: int | None = None) -> bytes:
        if self.role == "network":
            return self.outcome[1]
        if self.role == "k6":
            return b"k6 output\n"
        env = self.params["environment"]
        listening = {
            "event": "listening",
            "port": int(env["PORT"]),
            "metrics_port": int(env["METRICS_PORT"]),
            "workers": 2,
            "tls": "TLS_CERT_FILE" in env,
            "response_model": env["RESPONSE_MODEL"],
        }
        out = json.dumps(listening).encode() + b"\n" if self.client.service_listens else b""
        return out + (b"service stderr\n" if stderr else b"")

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict]:
        """The certs volume's files; from a k6 container, the file k6 wrote (k6_results)."""
        self.client.calls.append(("get_archive", self.name, path))
        files = {f"certs/{name}": data for name, data in self.client.volume_files.items()}
        if self.role == "k6":
            if path not in self.client.k6_results:
                raise NotFound(path)
            files = {path.rpartition("/")[2]: self.client.k6_results[path]}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return iter([buffer.getvalue()]), {}

    def put_archive(self, path: str, data: bytes) -> bool:
        self.client.calls.append(("put_archive", self.name, path))
        self.archive = data
        return True

    def stop(self, timeout: int) -> None:
        self.client.calls.append(("stop", self.name, timeout))
        self.attrs["State"]["Status"] = "exited"

    def wait(self, timeout: float | None = None) -> dict[str, int]:
        return {"StatusCode": self.outcome[0]}

    def remove(self, force: bool) -> None:
        self.client.calls.append(("remove", self.name, force))
        self.client.removed.append(self.name)


class FakeDocker:
    def __init__(self, ncpu: int = 8, leftovers: tuple[str, ...] = (), images: dict | None = None) -> None:
        self.ncpu, self.images_present = ncpu, compose_images() if images is None else images
        self.calls: list[tuple] = []
        self.created: list[FakeContainer] = []
        self.removed: list[str] = []
        self.pulled: list[str] = []
        self.service_listens = True
        self.host_port = 1  # where published ports lead: a real HTTP server in the flow tests
        self.volume_files: dict[str, bytes] = {}
        self.service_stats: list[dict] = []
        self.k6_stats: list[list[dict]] = []  # per k6 container, in order
        self.k6_results: dict[str, bytes] = {}  # what k6 on a load engine wrote, by container path
        self.mem_total: int | None = None  # info()'s MemTotal, when set
        self.on_k6_start: Callable[[FakeContainer], None] = lambda container: None
        self.leftovers = [FakeContainer(self, {"name": n, "labels": {}}) for n in leftovers]
        self.containers = SimpleNamespace(create=self._create, list=self._list, get=self._get)
        self.interrupt_create_of: str | None = None  # a role whose create is cut short by Ctrl-C
        self.images = SimpleNamespace(
            get=self._image, pull=lambda repo, tag: self.pulled.append(f"{repo}:{tag}"), build=self._build
        )
        self.image_labels: dict[str, dict[str, str]] = {}
        self.image_ids: dict[str, str] = {}
        self.built: list[dict[str, Any]] = []
        # kind of network helper ("tc", "serve", "probe") -> (exit code, output)
        self.helper_outcomes: dict[str, tuple[int, bytes]] = {}
        self.networks = SimpleNamespace(get=lambda name: self.calls.append(("network", name)))
        self.volumes = SimpleNamespace(get=lambda name: self.calls.append(("volume", name)))

    def _create(self, **params: Any) -> FakeContainer:
        container = FakeContainer(self, params)
        self.created.append(container)
        if container.role == self.interrupt_create_of:
            # The engine made the container, but the Ctrl-C arrived before the answer did.
            raise KeyboardInterrupt
        return container

    def _list(self, all: bool, filters: dict) -> list[FakeContainer]:
        self.calls.append(("list", all, filters))
        if filters == {"label": "protolab.managed=true"}:
            return self.leftovers
        key, _, value = filters["label"].partition("=")
        return [
            c for c in self.created if c.name not in self.removed and c.params["labels"].get(key) == value
        ]

    def _get(self, name: str) -> FakeContainer:
        for container in self.created:
            if container.name == name and name not in self.removed:
                return container
        raise NotFound(name)

    def _image(self, name: str) -> SimpleNamespace:
        if name not in self.images_present:
            raise ImageNotFound(name)
        labels = self.image_labels.get(name)
        config = {"Env": self.images_present[name], "Labels": labels}
        return SimpleNamespace(id=self.image_ids.get(name, f"sha256:{name}"), attrs={"Config": config})

    def _build(self, **params: Any) -> tuple[SimpleNamespace, list[dict]]:
        self.built.append(params)
        self.images_present[params["tag"]] = []
        self.image_labels[params["tag"]] = params["labels"]
        return self._image(params["tag"]), []

    def info(self) -> dict[str, int]:
        return {"NCPU": self.ncpu} | ({} if self.mem_total is None else {"MemTotal": self.mem_total})

    def ping(self) -> bool:
        return True

    version_answer = "27.5.1"

    def version(self) -> dict[str, str]:
        return {"Version": self.version_answer}

    def close(self) -> None:
        self.calls.append(("close",))


# --- Fixtures ----------------------------------------------------------------------------------


def scenario(target: str, profile: str = "p1") -> Scenario:
    plan = expand(MATRIX, "docker", overrides=Overrides(targets=(target,), profiles=(profile,)))
    return plan.scenarios[0]


def settings(tmp_path: Path) -> BackendSettings:
    return BackendSettings(
        run_id=RUN_ID,
        root=ROOT,
        certs_dir=tmp_path / "certs",
        logs_dir=tmp_path / "out" / "logs",
        k6_binary=Path("/nonexistent/k6"),  # the docker backend runs the k6 image
        start_timeout_s=5.0,
        stop_timeout_s=20.0,
    )


@pytest.fixture
def fake() -> FakeDocker:
    return FakeDocker()


@pytest.fixture(autouse=True)
def no_polling_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_engine, "_K6_POLL_S", 0.0)
    monkeypatch.setattr(docker_engine, "_POLL_S", 0.01)


@pytest.fixture(autouse=True)
def compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults a user gets: CI exports tests/docker/substitutes.env (K6_IMAGE, SERVICE_NOFILE)."""
    for variable in ("K6_IMAGE", "SERVICE_NOFILE"):
        monkeypatch.delenv(variable, raising=False)


class _Service(BaseHTTPRequestHandler):
    """Stands in for a REST service behind its published ports: health, records and metrics."""

    protocol_version = "HTTP/1.1"  # what the verifier must see negotiated

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            body = {"status": "SERVING"}
        elif url.path == "/records":
            count = int(parse_qs(url.query)["count"][0])
            car = {"make": "Ford", "model": "T", "trim": "base", "color": "black", "year": 1920, "mileage": 7}
            driver = {"firstname": "Ada", "lastname": "Lovelace", "driverId": "d-1"}
            body = {"records": [{"car": car, "driver": driver}] * count}
        else:
            peak = f"protolab_cgroup_memory_peak_bytes {MEMORY_PEAK:.8e}\n"
            self._send(f'protolab_build_info{{service="x"}} 1.0\n{peak}'.encode(), "text/plain")
            return
        self._send(json.dumps(body).encode(), "application/json")

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def published_service(fake: FakeDocker) -> Iterator[FakeDocker]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.host_port = server.server_port
    yield fake
    server.shutdown()
    server.server_close()


def run_config(tmp_path: Path) -> runner.RunConfig:
    return runner.RunConfig(
        run_id=RUN_ID,
        out_dir=tmp_path / "out",
        targets_dir=tmp_path / "targets",
        influxdb_url="http://127.0.0.1:8086",
        prometheus_url=None,
        resume=False,
        argv=("run_matrix.py",),
        backend_reason="test",
        provenance={},
    )


def flow_plan() -> Plan:
    overrides = Overrides(targets=("aiohttp-h1",), counts=(3,), duration="2s", warmup="1s", repeats=1)
    return expand(MATRIX, "docker", overrides=overrides)


def k6_summary(requests: int) -> dict:
    latency = {s: 1.5 for s in ("avg", "p(50)", "p(90)", "p(95)", "p(99)", "max")}
    return {
        "metrics": {
            "protolab_reqs": {"values": {"count": requests, "rate": requests / 2}},
            "protolab_req_failed": {"values": {"passes": 0, "fails": requests, "rate": 0.0}},
            "protolab_req_duration": {"values": latency},
        },
        "state": {"testRunDurationMs": 2000},
    }


# --- Container parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "nano_cpus", "memory", "service_cpus", "k6_cpus"),
    [
        ("p1", 2_000_000_000, 2 * 2**30, "6,7", "0,1,2,3,4,5"),
        ("p2", 4_000_000_000, 4 * 2**30, "4,5,6,7", "0,1,2,3"),
        ("small", 500_000_000, 512 * 2**20, "7", "0,1,2,3,4,5,6"),
    ],
)
def test_service_container_parameters_per_profile(
    tmp_path: Path,
    fake: FakeDocker,
    profile: str,
    nano_cpus: int,
    memory: int,
    service_cpus: str,
    k6_cpus: str,
) -> None:
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(scenario("aiohttp-h1", profile))
    [container] = fake.created
    assert container.params == {
        "image": "protolab-rest-aiohttp:local",
        "command": ["python", "-m", "services.rest_aiohttp"],
        "name": f"protolab-run1-aiohttp-h1-{profile}-c100-closed-r1",
        "environment": {
            "HOST": "0.0.0.0",
            "PORT": "8081",
            "METRICS_PORT": "9101",
            "RESPONSE_MODEL": "build",
            "SHUTDOWN_DRAIN_SECONDS": "0",
        },
        "network": "protolab",
        "ports": {"8081/tcp": ("127.0.0.1", None), "9101/tcp": ("127.0.0.1", None)},
        "nano_cpus": nano_cpus,
        "mem_limit": memory,
        "memswap_limit": memory,
        "cpuset_cpus": service_cpus,
        "labels": {
            "protolab.managed": "true",
            "protolab.run": "run1",
            "protolab.scenario": f"aiohttp-h1.{profile}.c100.closed.r1",
            "protolab.target": "aiohttp-h1",
            "protolab.profile": profile,
            "protolab.role": "service",
        },
        "volumes": {"protolab-certs": {"bind": "/certs", "mode": "ro"}},
        "ulimits": [Ulimit(name="nofile", soft=65536, hard=65536)],
        "healthcheck": {"test": ["NONE"]},
        "init": True,
        "read_only": True,
        "tmpfs": {"/tmp": ""},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }
    assert handle.service_cpus == tuple(map(int, service_cpus.split(",")))
    assert handle.k6_cpus == tuple(map(int, k6_cpus.split(",")))
    assert (handle.address.host, handle.address.port) == ("127.0.0.1", fake.host_port)
    assert str(handle.metrics_address) == f"127.0.0.1:{fake.host_port}"
    assert str(handle.k6_address) == "rest-aiohttp:8081"
    assert handle.prometheus_target == f"protolab-run1-aiohttp-h1-{profile}-c100-closed-r1:9101"
    assert (handle.workers, handle.limits, handle.notes) == (2, "docker", ())


def test_k6_shares_cpus_with_the_service_when_the_engine_has_too_few(tmp_path: Path) -> None:
    fake = FakeDocker(ncpu=2)
    handle = DockerBackend(settings(tmp_path), fake, say=lambda line: None).start_service(scenario("grpc"))
    assert fake.created[0].params["cpuset_cpus"] == "0,1"
    assert handle.service_cpus == handle.k6_cpus == (0, 1)
    assert handle.notes == (
        "k6 shares CPUs 0,1 with the service: the Docker engine has 2 CPUs and the p1 profile needs 2",
    )


def test_tls_target_env_and_the_volume_ca_adopted_for_host_verification(
    tmp_path: Path, fake: FakeDocker
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_bytes(b"a CA the containers do not use")
    fake.volume_files = {
        "ca.pem": b"volume ca",
        "ca-key.pem": b"volume ca key",
        "server.pem": b"volume server",
        "server-key.pem": b"volume server key",
    }
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(scenario("quart-h2-tls"))
    assert fake.created[0].params["image"] == "protolab-rest-quart:local"
    assert fake.created[0].params["environment"] == {
        "HOST": "0.0.0.0",
        "PORT": "8082",
        "METRICS_PORT": "9102",
        "RESPONSE_MODEL": "build",
        "SHUTDOWN_DRAIN_SECONDS": "0",
        "TLS_CERT_FILE": "/certs/server.pem",
        "TLS_KEY_FILE": "/certs/server-key.pem",
        "ALPN_PROTOCOLS": "h2",
    }
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == fake.volume_files
    assert stat.S_IMODE((certs / "server-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((certs / "ca.pem").stat().st_mode) == 0o644
    assert handle.notes == (
        f"copied ca-key.pem, ca.pem, server-key.pem, server.pem from volume protolab-certs into {certs} "
        "(the services' CA)",
    )
    # The certificate names the compose service, so that is the name k6 dials.
    assert str(handle.k6_address) == "rest-quart:8082"
    backend.stop_service(handle)
    backend.start_service(scenario("grpc-tls"))
    assert [c for c in fake.calls if c[0] == "get_archive"] == [
        ("get_archive", "protolab-run1-quart-h2-tls-p1-c100-closed-r1", "/certs")
    ]


def test_k6_container_parameters(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service
    fake.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    ok = runner.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )
    assert not ok  # no summary from the fake k6; the parameters are what this test is about
    warmup = fake.created[1].params
    results = tmp_path / "out" / "k6"
    assert warmup == {
        "image": "grafana/k6:1.1.0",
        "command": [
            "run",
            "--quiet",
            "--no-color",
            "--address",
            "",
            "--summary-trend-stats",
            "avg,min,med,max,p(50),p(90),p(95),p(99),count",
            "--tag",
            "run=run1",
            "--tag",
            "scenario=aiohttp-h1.p1.c3.closed.r1",
            "--tag",
            "target=aiohttp-h1",
            "--tag",
            "protocol=http1.1",
            "--tag",
            "profile=p1",
            "/k6/rest.js",
        ],
        "name": "protolab-run1-aiohttp-h1-p1-c3-closed-r1-k6",
        "environment": {
            "K6_NO_USAGE_REPORT": "true",
            "SUMMARY_FILE": "/results/aiohttp-h1.p1.c3.closed.r1.warmup.json",
            "COUNT": "3",
            "TLS": "0",
            "DURATION": "1s",
            "LOAD_MODEL": "constant-vus",
            "VUS": "10",
            "BASE_URL": "http://rest-aiohttp:8081",
            "EXPECT_PROTO": "HTTP/1.1",
            "GODEBUG": "http2client=0",
        },
        "network": "protolab",
        "extra_hosts": {"rest-aiohttp": SERVICE_IP},
        "cpuset_cpus": "0,1,2,3,4,5",
        "user": f"{os.getuid()}:{os.getgid()}",
        "labels": {
            "protolab.managed": "true",
            "protolab.run": "run1",
            "protolab.scenario": "aiohttp-h1.p1.c3.closed.r1",
            "protolab.target": "aiohttp-h1",
            "protolab.profile": "p1",
            "protolab.role": "k6",
        },
        "volumes": {
            str(ROOT / "k6"): {"bind": "/k6", "mode": "ro"},
            str(ROOT / "proto"): {"bind": "/proto", "mode": "ro"},
            "protolab-certs": {"bind": "/certs", "mode": "ro"},
            str(results): {"bind": "/results", "mode": "rw"},
        },
        "ulimits": [Ulimit(name="nofile", soft=65536, hard=65536)],
    }
    measured = fake.created[2].params
    assert measured["command"][-3:] == ["--out", "influxdb=http://influxdb:8086/myk6db", "/k6/rest.js"]
    assert measured["environment"]["SUMMARY_FILE"] == "/results/aiohttp-h1.p1.c3.closed.r1.measure.json"


def test_grpc_tls_k6_paths_move_into_the_mounts(tmp_path: Path, fake: FakeDocker) -> None:
    fake.volume_files = {"ca.pem": b"ca"}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    target = scenario("grpc-tls")
    handle = backend.start_service(target)
    invocation = k6.build_invocation(
        target,
        handle,
        run_id=RUN_ID,
        root=ROOT,
        ca_file=tmp_path / "certs" / "ca.pem",
        summary_file=tmp_path / "out" / "k6" / "grpc.json",
        log_file=tmp_path / "out" / "logs" / "grpc.k6.log",
        influxdb_url=None,
        warmup=True,
    )
    backend.run_k6(handle, invocation, measured=False)
    env = fake.created[1].params["environment"]
    assert (env["GRPC_ADDR"], env["PROTO_DIR"], env["SSL_CERT_FILE"]) == (
        "grpc-aio:50051",
        "/proto",
        "/certs/ca.pem",
    )
    assert fake.created[1].params["command"][-1] == "/k6/grpc_unary.js"


def engine_request(params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The create request the real docker SDK would send the Engine API for these parameters."""
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.45")
    sent: dict[str, Any] = {}

    def capture(config: dict[str, Any], name: str, platform: str | None = None) -> None:
        sent.update(config, Name=name)
        raise NotFound("captured, not sent")

    monkeypatch.setattr(client.api, "create_container_from_config", capture)
    with pytest.raises(NotFound, match="captured"):
        client.containers.create(**params)
    return sent


def test_the_real_sdk_turns_the_parameters_into_the_engine_request(
    tmp_path: Path, published_service: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = published_service
    fake.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    runner.run_plan(flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None)
    service = engine_request(fake.created[0].params, monkeypatch)
    host = service["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"]) == (2_000_000_000, 2 * 2**30, 2 * 2**30)
    assert (host["CpusetCpus"], host["NetworkMode"], host["Binds"]) == (
        "6,7",
        "protolab",
        ["protolab-certs:/certs:ro"],
    )
    assert host["PortBindings"] == {
        "8081/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}],
        "9101/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}],
    }
    assert host["Ulimits"] == [{"Name": "nofile", "Soft": 65536, "Hard": 65536}]
    assert (host["Init"], host["ReadonlyRootfs"], host["CapDrop"]) == (True, True, ["ALL"])
    assert service["Healthcheck"]["Test"] == ["NONE"]
    assert service["Labels"]["protolab.managed"] == "true"
    k6_request = engine_request(fake.created[1].params, monkeypatch)
    assert k6_request["HostConfig"]["ExtraHosts"] == [f"rest-aiohttp:{SERVICE_IP}"]
    assert f"{ROOT / 'k6'}:/k6:ro" in k6_request["HostConfig"]["Binds"]
    assert "PortBindings" not in k6_request["HostConfig"]  # k6 publishes nothing


# --- A whole scenario through the runner, and cleanup ------------------------------------------


def test_scenario_through_the_runner_collects_usage_and_removes_everything(
    tmp_path: Path, published_service: FakeDocker
) -> None:
    fake = published_service
    fake.service_stats = [
        docker_stats(10.0, 100, 5, 0.25, usage=50_000_000, limit=2 * 2**30),
        docker_stats(13.5, 120, 9, 0.75, usage=60_000_000, limit=2 * 2**30),  # cgroup v2: no max_usage
    ]
    fake.k6_stats = [
        [docker_stats(0.4, 0, 0, 0)],
        [docker_stats(0.9, 0, 0, 0), docker_stats(1.2, 0, 0, 0), docker_stats(0.0, 0, 0, 0)],
    ]
    file_sd: list[Any] = []

    def k6_writes_its_summary(container: FakeContainer) -> None:
        host = next(h for h, m in container.params["volumes"].items() if m["bind"] == "/results")
        summary = container.params["environment"]["SUMMARY_FILE"].replace("/results", host)
        Path(summary).write_text(json.dumps(k6_summary(200)))
        file_sd.extend(json.loads(p.read_text()) for p in (tmp_path / "targets").glob("*.json"))

    fake.on_k6_start = k6_writes_its_summary
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    assert runner.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )

    [result_file] = (tmp_path / "out" / "scenarios").glob("*.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "ok", result["failure"]
    usage = result["service"]["usage"]
    assert usage["cpu_seconds"] == pytest.approx(3.5)
    assert (usage["cpu_periods"], usage["throttled_periods"]) == (20, 4)
    assert usage["throttled_seconds"] == pytest.approx(0.5)
    assert (usage["memory_peak_bytes"], usage["memory_peak_scope"]) == (MEMORY_PEAK, "lifetime")
    assert (usage["memory_limit_bytes"], usage["cpu_limit_cores"], usage["exit_code"]) == (2 * 2**30, 2.0, 0)
    # The last sample before the exit is the total; a stopped container's zero is not.
    assert result["k6"]["cpu_seconds"] == pytest.approx(1.2)
    assert result["k6"]["cpus"] == 6
    assert result["service"]["limits"] == "docker"
    name = "protolab-run1-aiohttp-h1-p1-c3-closed-r1"
    assert file_sd[-1] == [
        {
            "targets": [f"{name}:9101"],
            "labels": {
                "run": "run1",
                "scenario": "aiohttp-h1.p1.c3.closed.r1",
                "target": "aiohttp-h1",
                "protocol": "http1.1",
                "profile": "p1",
                "service": "rest_aiohttp",
            },
        }
    ]
    assert ("stop", name, 20) in fake.calls
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert all(force for call, _, force in (c for c in fake.calls if c[0] == "remove"))
    assert (
        (tmp_path / "out" / "logs" / "aiohttp-h1.p1.c3.closed.r1.service.log")
        .read_bytes()
        .endswith(b"service stderr\n")
    )
    assert b"k6 output" in (tmp_path / "out" / "logs" / "aiohttp-h1.p1.c3.closed.r1.k6.log").read_bytes()


def test_error_mid_scenario_removes_service_and_k6(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service

    def k6_fails(container: FakeContainer) -> None:
        raise DockerException("k6 image is broken")

    fake.on_k6_start = k6_fails
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    assert not runner.run_plan(
        flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None
    )
    [result_file] = (tmp_path / "out" / "scenarios").glob("*.json")
    failure = json.loads(result_file.read_text())["failure"]
    assert (failure["phase"], failure["message"]) == ("warmup", "docker: k6 image is broken")
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert len(fake.created) == 2


def test_ctrl_c_removes_service_and_k6(tmp_path: Path, published_service: FakeDocker) -> None:
    fake = published_service

    def interrupted(container: FakeContainer) -> None:
        raise KeyboardInterrupt

    fake.on_k6_start = interrupted
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan(flow_plan(), run_config(tmp_path), backend, settings(tmp_path), say=lambda line: None)
    assert sorted(fake.removed) == sorted(c.name for c in fake.created)
    assert [c.role for c in fake.created] == ["service", "k6"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"] is False


def test_service_that_exits_before_listening_is_removed_with_its_log(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.service_listens = False
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    target = scenario("grpc")
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(target)
    assert (failed.value.phase, failed.value.message) == ("start", "services.grpc_aio exited (exit code 1)")
    assert failed.value.log_tail == "service stderr"
    assert fake.removed == [fake.created[0].name]
    assert (tmp_path / "out" / "logs" / f"{target.id}.service.log").read_bytes() == b"service stderr\n"
    backend.close()
    assert len(fake.removed) == 1


def test_missing_image_fails_the_scenario_with_the_build_command(tmp_path: Path) -> None:
    fake = FakeDocker(images={"grafana/k6:1.1.0": []})
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    build = "build it with `docker compose --profile services build`"
    with pytest.raises(ScenarioFailed, match=rf"protolab-grpc-aio:local not found: {build}"):
        backend.start_service(scenario("grpc"))
    assert fake.created == []


def test_leftovers_of_an_interrupted_run_are_removed_by_label(tmp_path: Path) -> None:
    fake = FakeDocker(leftovers=("protolab-old-a", "protolab-old-a-k6"))
    said: list[str] = []
    DockerBackend(settings(tmp_path), fake, say=said.append)
    assert ("list", True, {"label": "protolab.managed=true"}) in fake.calls
    assert fake.removed == ["protolab-old-a", "protolab-old-a-k6"]
    assert ("remove", "protolab-old-a", True) in fake.calls
    assert said == ["docker: removed 2 container(s) of an interrupted run: protolab-old-a, protolab-old-a-k6"]


def test_k6_image_is_pulled_when_missing_and_a_lab_that_is_not_up_is_refused(tmp_path: Path) -> None:
    fake = FakeDocker(images={})
    said: list[str] = []
    DockerBackend(settings(tmp_path), fake, say=said.append)
    assert (fake.pulled, said) == (["grafana/k6:1.1.0"], ["docker: pulling grafana/k6:1.1.0"])
    assert ("network", "protolab") in fake.calls and ("volume", "protolab-certs") in fake.calls

    def missing(name: str) -> None:
        raise NotFound(name)

    fake.networks.get = missing
    with pytest.raises(BackendUnavailable, match=r"network protolab not found: start the lab first"):
        DockerBackend(settings(tmp_path), fake, say=said.append)


# --- Usage from stats --------------------------------------------------------------------------


def test_usage_from_two_stats_snapshots_cgroup_v1() -> None:
    before = StatsSnapshot.parse(docker_stats(1.0, 10, 1, 0.1, usage=1, max_usage=300, limit=512))
    after = StatsSnapshot.parse(docker_stats(2.5, 40, 6, 0.35, usage=1, max_usage=900, limit=512))
    usage = docker_engine.usage_from_stats(UsageWindow(before, after, 3.0, None), 0.5, 0, "tail")
    assert usage.window_seconds == 3.0
    assert usage.cpu_seconds == pytest.approx(1.5)
    assert (usage.cpu_periods, usage.throttled_periods) == (30, 5)
    assert usage.throttled_seconds == pytest.approx(0.25)
    assert (usage.memory_peak_bytes, usage.memory_peak_scope, usage.memory_limit_bytes) == (
        900,
        "lifetime",
        512,
    )
    assert (usage.cpu_limit_cores, usage.exit_code, usage.log_tail) == (0.5, 0, "tail")


def test_usage_cgroup_v2_takes_the_peak_from_the_service_metric() -> None:
    before = StatsSnapshot.parse(docker_stats(1.0, 10, 1, 0.1, usage=1, limit=512))
    after = StatsSnapshot.parse(docker_stats(2.0, 20, 1, 0.1, usage=1, limit=512))
    assert (
        docker_engine.usage_from_stats(UsageWindow(before, after, 1.0, 400), 1.0, 0, "").memory_peak_bytes
        == 400
    )
    no_peak = docker_engine.usage_from_stats(UsageWindow(before, after, 1.0, None), 1.0, 0, "")
    assert (no_peak.memory_peak_bytes, no_peak.memory_peak_scope) == (None, None)
    assert (
        docker_engine.memory_peak_from_metrics("x 1\nprotolab_cgroup_memory_peak_bytes 1.5e+08\n")
        == 150_000_000
    )


def test_usage_without_a_measured_window() -> None:
    usage = docker_engine.usage_from_stats(None, 2.0, 137, "killed")
    assert (usage.window_seconds, usage.cpu_seconds, usage.exit_code, usage.log_tail) == (
        None,
        None,
        137,
        "killed",
    )


# --- Names -------------------------------------------------------------------------------------


def test_container_names_are_unique_dns_labels() -> None:
    assert docker_engine.container_name("20250101-120000", "quart-h2-tls.p1.c100.closed.r1") == (
        "protolab-20250101-120000-quart-h2-tls-p1-c100-closed-r1"
    )
    long_a = docker_engine.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r10"
    )
    long_b = docker_engine.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r11"
    )
    assert long_a != long_b
    for name in (long_a, long_b):
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower(), name


def test_names_agree_with_docker_compose() -> None:
    services = COMPOSE["services"]
    assert COMPOSE["networks"]["default"]["name"] == docker_engine.NETWORK
    assert COMPOSE["volumes"]["certs"]["name"] == docker_engine.CERTS_VOLUME
    k6 = services["k6"]
    assert k6["image"] == docker_engine.K6_IMAGE
    assert k6["environment"]["K6_OUT"] == f"influxdb=http://{docker_engine.INFLUXDB_IN_NETWORK}/myk6db"
    assert {"./k6:/k6:ro", "./proto:/proto:ro", "certs:/certs:ro"} <= set(k6["volumes"])
    assert k6["environment"]["SSL_CERT_FILE"] == "/certs/ca.pem"
    built = {name: s for name, s in services.items() if "SERVICE" in s.get("build", {}).get("args", {})}
    assert {t.service for t in MATRIX.targets.values()} <= {
        s["build"]["args"]["SERVICE"] for s in built.values()
    }
    for name, service in built.items():
        module = service["build"]["args"]["SERVICE"]
        assert (docker_engine.compose_name(module), docker_engine.image_name(module)) == (
            name,
            service["image"],
        )
        # The runner's containers are hardened like compose's services under test.
        hardening = {key: service[key] for key in ("init", "read_only", "cap_drop", "security_opt")}
        assert {**hardening, "tmpfs": dict.fromkeys(service["tmpfs"], "")} == docker_engine.SERVICE_HARDENING
        assert int(service["ulimits"]["nofile"]) == docker_engine.NOFILE
        assert service["volumes"] == [f"certs:{docker_engine.CERTS_DIR}:ro"]
        assert service["mem_limit"] == service["memswap_limit"]


# --- Choosing the backend ----------------------------------------------------------------------


def test_auto_picks_docker_when_the_engine_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDocker()
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    assert backends.choose("auto") == ("docker", "auto: Docker engine 27.5.1 answered")
    assert fake.calls == [("network", "protolab"), ("close",)]
    assert backends.choose("local") == ("local", "requested")


def test_auto_takes_local_when_the_engine_answers_but_the_lab_is_not_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Docker installed for other reasons: the README's main command must still run, locally.
    fake = FakeDocker()

    def missing(name: str) -> None:
        raise NotFound(name)

    fake.networks.get = missing
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    assert backends.choose("auto") == (
        "local",
        "auto: Docker engine 27.5.1 answered, but the lab is not up on it (no network protolab; "
        "start it with `docker compose up -d`)",
    )
    assert ("close",) in fake.calls


def test_auto_falls_back_to_local_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDocker()

    def no_answer() -> bool:
        raise DockerException("Error while fetching server API version: connection refused")

    fake.ping = no_answer  # type: ignore[method-assign]
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    monkeypatch.delenv("DOCKER_HOST", raising=False)  # the message names the default socket
    assert cli.main(["--dry-run", "--target", "grpc"]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line == (
        "backend: local (auto: Docker engine local (unix:///var/run/docker.sock) did not answer: "
        "Error while fetching server API version: connection refused)"
    )


def test_backend_docker_without_an_engine_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real SDK against a socket nobody listens on.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    socket_url = f"unix://{tmp_path}/no-engine.sock"
    with pytest.raises(
        BackendUnavailable,
        match=rf"^--backend docker: service engine local \({re.escape(socket_url)}\) did not answer: .+; st",
    ):
        backends.create("docker", settings(tmp_path))
    argv = ["--backend", "docker", "--target", "grpc", "--k6", "/bin/true", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert "run_matrix.py: error: --backend docker: service engine local" in capsys.readouterr().err


# --- Defects found under a real engine (issue 12) --------------------------------------------------


@pytest.mark.parametrize("role", ["service", "k6"])
def test_a_ctrl_c_during_a_containers_create_leaves_no_container(
    role: str, fake: FakeDocker, tmp_path: Path
) -> None:
    fake.interrupt_create_of = role
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        handle = backend.start_service(scenario("grpc"))
        invocation = k6.build_invocation(
            scenario("grpc"), handle, run_id=RUN_ID, root=ROOT, ca_file=tmp_path / "ca.pem",
            summary_file=tmp_path / "out" / "k6" / "s.json", log_file=tmp_path / "out" / "logs" / "k6.log",
            influxdb_url=None, warmup=False,
        )  # fmt: skip
        backend.run_k6(handle, invocation, measured=True)
    backend.close()
    assert [c.name for c in fake.created if c.role == role], "the create must have been reached"
    assert {c.name for c in fake.created} <= set(fake.removed)


def test_a_profile_larger_than_the_engine_is_refused_before_any_container(tmp_path: Path) -> None:
    fake = FakeDocker(ncpu=2)
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed, match=r"^start: profile p2 asks for 4 CPUs; the Docker engine has 2$"):
        backend.start_service(scenario("grpc", profile="p2"))
    assert fake.created == []


def test_an_engine_older_than_25_is_refused_with_what_the_lab_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDocker()
    fake.version_answer = "20.10.24+dfsg1"
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    reason = "Docker engine 20.10.24+dfsg1 answered, but the lab needs Engine 25.0 or newer"
    refused = rf"^--backend docker: service engine local .*: {re.escape(reason)}"
    with pytest.raises(BackendUnavailable, match=refused):
        backends.create("docker", settings(Path("/nonexistent")))
    name, why = backends.choose("auto")
    assert (name, why.startswith(f"auto: {reason}")) == ("local", True)


# --- Network conditions: a tc helper in the service's namespace, a probe on k6's network ----------

PROBE_IP = "172.18.0.10"
NARROW_RATE = NetworkProfile("narrow-rate", rate_bps=10_000_000)  # a rate-only profile: tbf alone


def network_scenario(network: str | NetworkProfile, target: str = "aiohttp-h1") -> Scenario:
    if isinstance(network, NetworkProfile):
        return dataclasses.replace(scenario(target), network=network)
    overrides = Overrides(targets=(target,), profiles=("p1",), networks=(network,))
    return expand(MATRIX, "docker", overrides=overrides).scenarios[0]


def probe_answers(rtt_s: float, rate_bps: float | None = None) -> tuple[int, bytes]:
    measured = {"event": "measured", "address": PROBE_IP, "rtt_s": [rtt_s] * 21, "rate_bps": rate_bps}
    return 0, json.dumps(measured).encode() + b"\n"


def helpers(fake: FakeDocker) -> dict[str, FakeContainer]:
    return {c.name.removeprefix(fake.created[0].name + "-"): c for c in fake.created if c.role == "network"}


# The exact commands, from the profile: wan is 25 ms +/- 5 ms per direction; narrow-rate 10 Mbit/s.
WAN_NETEM = ["netem", "limit", "10000", "delay", "25000us", "5000us"]
TBF_10MBIT = ["tbf", "rate", "10000000bit", "burst", "3028", "limit", "68564"]
INGRESS_TO_IFB = [
    ["ip", "link", "add", "plab-ifb", "type", "ifb"],
    ["ip", "link", "set", "plab-ifb", "up"],
    ["tc", "qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"],
    ["tc", "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0",
     "0", "action", "mirred", "egress", "redirect", "dev", "plab-ifb"],
]  # fmt: skip


def test_a_netem_profile_is_applied_by_a_helper_with_net_admin_in_the_service_namespace(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(0.0502)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(network_scenario("wan"))
    service = fake.created[0]
    assert service.role == "service" and "cap_add" not in service.params
    assert service.params["cap_drop"] == ["ALL"] and "network_mode" not in service.params
    assert list(helpers(fake)) == ["tc", "link-serve", "link-probe"]  # in this order, after the service
    tc = helpers(fake)["tc"]
    script = "\n".join(" ".join(c) for c in docker_engine.tc_commands(network_scenario("wan").network))
    assert docker_engine.tc_commands(network_scenario("wan").network) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", *WAN_NETEM],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "1:", *WAN_NETEM],
    ]
    assert tc.params == {
        "image": "protolab-network-helper:local",
        "command": ["sh", "-exc", script],
        "name": f"{service.name}-tc",
        "network_mode": f"container:id-{service.name}",  # the service's namespace, not a network
        "user": "0:0",
        "cap_drop": ["ALL"],
        "cap_add": ["NET_ADMIN"],
        "security_opt": ["no-new-privileges:true"],
        "labels": {**service.params["labels"], "protolab.role": "network"},
    }
    probe_file = {
        str(ROOT / "scripts/labrunner/network/docker_probe.py"): {
            "bind": "/probe/docker_probe.py",
            "mode": "ro",
        }
    }
    unprivileged = {"user": "65534:65534", "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"]}
    assert helpers(fake)["link-serve"].params == {
        "image": "protolab-network-helper:local",
        "command": ["python", "/probe/docker_probe.py", "serve", "--port", "5201"],
        "name": f"{service.name}-link-serve",
        "network_mode": f"container:id-{service.name}",
        "labels": {**service.params["labels"], "protolab.role": "network"},
        "volumes": probe_file,
        **unprivileged,
    }
    assert helpers(fake)["link-probe"].params == {
        "image": "protolab-network-helper:local",
        "command": ["python", "/probe/docker_probe.py", "measure", "--host", SERVICE_IP, "--port", "5201",
                    "--samples", "21", "--rate-seconds", "0"],
        "name": f"{service.name}-link-probe",
        "network": "protolab",  # k6's network, on k6's CPUs
        "cpuset_cpus": "0,1,2,3,4,5",
        "labels": {**service.params["labels"], "protolab.role": "network"},
        "volumes": probe_file,
        **unprivileged,
    }  # fmt: skip
    assert set(fake.removed) == {f"{service.name}-{kind}" for kind in ("tc", "link-serve", "link-probe")}
    assert handle.network == {
        "emulator": "netem",
        "service_address": SERVICE_IP,
        "client_address": PROBE_IP,
        "measured_rtt_s": 0.0502,
        "measured_rate_bps": None,
    }


def test_a_rate_only_profile_is_limited_by_tbf_alone_and_its_rate_measured(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(0.0001, 9_700_000.0)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(network_scenario(NARROW_RATE))
    assert docker_engine.tc_commands(NARROW_RATE) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "10:", *TBF_10MBIT],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "10:", *TBF_10MBIT],
    ]
    assert helpers(fake)["tc"].params["command"][-1].splitlines()[0] == (
        "tc qdisc replace dev eth0 root handle 10: tbf rate 10000000bit burst 3028 limit 68564"
    )
    assert helpers(fake)["link-probe"].params["command"][-2:] == ["--rate-seconds", "3"]
    assert handle.network is not None
    assert (handle.network["emulator"], handle.network["measured_rate_bps"]) == ("tbf", 9_700_000.0)


def test_netem_with_a_rate_puts_tbf_under_netem_on_both_devices() -> None:
    narrow = network_scenario("narrow").network
    netem = ["netem", "limit", "10000", "delay", "10000us"]
    tbf = ["tbf", "rate", "10000000bit", "burst", "3028", "limit", "68564"]
    assert docker_engine.tc_commands(narrow) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", *netem],
        ["tc", "qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "10:", *tbf],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "1:", *netem],
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "parent", "1:1", "handle", "10:", *tbf],
    ]


def test_a_kernel_without_netem_fails_the_scenario_naming_sch_netem_and_removes_everything(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"tc": (2, b"+ tc qdisc replace dev eth0 root handle 1: netem ...\n"
                                      b"Error: Specified qdisc kind is unknown.\n")}  # fmt: skip
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(network_scenario("lossy"))
    assert failed.value.phase == "network"
    assert str(failed.value.message) == (
        "network lossy: the Docker engine's kernel has no netem (sch_netem): `tc qdisc ... netem` "
        'answers "Specified qdisc kind is unknown", and this profile\'s delay, jitter or loss need it. '
        "Use an engine whose kernel has sch_netem, or run it with --backend local, whose userspace "
        "link emulator works without netem; rate-only profiles work here (tbf)"
    )
    assert "Specified qdisc kind is unknown" in failed.value.log_tail
    assert list(helpers(fake)) == ["tc"]  # no probe on a link that is not emulated
    assert set(fake.removed) == {c.name for c in fake.created}  # the service too
    # Another tc failure is not blamed on netem.
    fake.helper_outcomes = {"tc": (2, b'Error: Cannot find device "plab-ifb"\n')}
    with pytest.raises(
        ScenarioFailed,
        match=r"^network: network lossy: tc in the service's network namespace failed \(exit 2\)$",
    ):
        backend.start_service(network_scenario("lossy"))


@pytest.mark.parametrize(
    ("network", "rtt_s", "rate_bps", "problem"),
    [
        ("wan", 0.0449, None, "RTT 44.900 ms is more than 5.000 ms off wan's 50.000 ms"),
        ("wan", 0.0001, None, "RTT 0.100 ms is more than 5.000 ms off wan's 50.000 ms"),  # no emulation
        (
            NARROW_RATE,
            0.0001,
            8_900_000.0,
            "rate 8.90 Mbit/s is more than 10% off narrow-rate's 10.00 Mbit/s",
        ),
        (NARROW_RATE, 0.0001, 900_000_000.0, "rate 900.00 Mbit/s is more than 10% off"),  # no limit
    ],
)
def test_a_link_more_than_10_percent_off_its_profile_fails_the_scenario(
    tmp_path: Path,
    fake: FakeDocker,
    network: str | NetworkProfile,
    rtt_s: float,
    rate_bps: float | None,
    problem: str,
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(rtt_s, rate_bps)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(network_scenario(network))
    assert failed.value.phase == "network"
    assert problem in failed.value.message
    assert set(fake.removed) == {c.name for c in fake.created}


def test_a_probe_that_fails_fails_the_scenario_with_its_error(tmp_path: Path, fake: FakeDocker) -> None:
    fake.helper_outcomes = {
        "probe": (1, b'{"event": "failed", "error": "ConnectionRefusedError: refused"}\n')
    }
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed, match=r"the link probe failed: ConnectionRefusedError: refused"):
        backend.start_service(network_scenario("wan"))


def test_the_helper_image_is_built_once_from_the_labs_base_and_again_when_its_inputs_change(
    tmp_path: Path, fake: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHON_IMAGE", raising=False)
    fake.helper_outcomes = {"probe": probe_answers(0.05)}
    said: list[str] = []
    backend = DockerBackend(settings(tmp_path), fake, say=said.append)
    backend.stop_service(backend.start_service(network_scenario("wan")))
    backend.stop_service(backend.start_service(network_scenario("wan")))
    dockerfile = (ROOT / "network-helper" / "Dockerfile").read_bytes()
    inputs = docker_engine.helper_inputs(dockerfile, "python:3.11.15-slim-bookworm", "")  # not pulled yet
    assert fake.built == [
        {
            "path": str(ROOT / "network-helper"),
            "tag": "protolab-network-helper:local",
            "buildargs": {},  # the Dockerfile's default base, as compose leaves services/Dockerfile's
            "labels": {"protolab.inputs": inputs},
            "rm": True,
        }
    ]
    assert said == [
        "docker: building protolab-network-helper:local from python:3.11.15-slim-bookworm (iproute2, for tc)"
    ]
    # CI's substitute base (tests/docker/substitutes.env): another base, so another image.
    monkeypatch.setenv("PYTHON_IMAGE", "protolab-test/python:3.11-debian")
    fake.images_present["protolab-test/python:3.11-debian"] = []
    fake.image_ids["protolab-test/python:3.11-debian"] = "sha256:base1"
    backend = DockerBackend(settings(tmp_path), fake, say=said.append)
    backend.start_service(network_scenario("wan"))
    assert fake.built[-1]["buildargs"] == {"PYTHON_IMAGE": "protolab-test/python:3.11-debian"}
    assert fake.built[-1]["labels"] == {
        "protolab.inputs": docker_engine.helper_inputs(
            dockerfile, "protolab-test/python:3.11-debian", "sha256:base1"
        )
    }
    assert len(fake.built) == 2
    # Built already from these inputs: a new run does not build again.
    DockerBackend(settings(tmp_path), fake, say=said.append).start_service(network_scenario("wan"))
    assert len(fake.built) == 2
    # The base rebuilt under the same name (CI's build-images.sh): the helper follows.
    fake.image_ids["protolab-test/python:3.11-debian"] = "sha256:base2"
    DockerBackend(settings(tmp_path), fake, say=said.append).start_service(network_scenario("wan"))
    assert len(fake.built) == 3


def test_loopback_starts_no_helper_and_records_no_link(tmp_path: Path, fake: FakeDocker) -> None:
    handle = DockerBackend(settings(tmp_path), fake, say=lambda line: None).start_service(scenario("grpc"))
    assert [c.role for c in fake.created] == ["service"] and fake.built == []
    assert handle.network is None


def test_the_helper_image_has_the_services_base_and_iproute2() -> None:
    helper = (ROOT / "network-helper" / "Dockerfile").read_text()
    services = (ROOT / "services" / "Dockerfile").read_text()
    default = re.compile(r"^ARG PYTHON_IMAGE=(\S+)$", re.MULTILINE)
    helper_default, services_default = default.search(helper), default.search(services)
    assert helper_default is not None and services_default is not None
    assert helper_default[1] == services_default[1] == docker_engine.PYTHON_IMAGE
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}$", helper, re.MULTILINE)
    assert re.search(r"apt-get install .*\biproute2\b", helper)


def test_the_link_probe_measures_rtt_and_rate_over_real_sockets() -> None:
    """docker_probe.py runs alone in the helper image: serve and measure over loopback here."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = threading.Thread(target=docker_probe.serve, args=(port, 5.0), daemon=True)
    server.start()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = docker_probe.main(
            ["measure", "--host", "127.0.0.1", "--port", str(port), "--samples", "5", "--rate-seconds", "0.4",
             "--mtu", "1500"]
        )  # fmt: skip
    server.join(10)
    assert code == 0 and not server.is_alive()  # the server ends with its bulk transfer
    measured = json.loads(out.getvalue().splitlines()[-1])
    assert measured["event"] == "measured" and measured["address"] == "127.0.0.1"
    assert len(measured["rtt_s"]) == 5 and all(0 < rtt < 0.05 for rtt in measured["rtt_s"])
    # Loopback: above any profile's rate (narrow: 10 Mbit/s), even with both ends of this one Python
    # process starved of CPU on a busy host.
    assert measured["rate_bps"] > 20e6
    # Nobody listening: a failure line, not a traceback.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setattr(docker_probe, "_CONNECT_RETRY_S", 0.2)
        assert (
            docker_probe.main(["measure", "--host", "127.0.0.1", "--port", str(port), "--samples", "1"]) == 1
        )
    assert json.loads(out.getvalue())["event"] == "failed"
