"""A thin fake of the docker client for the docker backend's tests: it records calls and behaves
only as far as the tests assert; with the scenarios and settings the tests build a backend from."""

import contextlib
import dataclasses
import io
import itertools
import json
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from docker.errors import ImageNotFound, NotFound
from labrunner.backends.base import BackendSettings
from labrunner.backends.docker import DockerBackend
from labrunner.cli import session
from labrunner.cli.session_config import SessionConfig
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Plan, Scenario
from labrunner.network.profiles import NetworkProfile
from labrunner.run import runner

from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.pool import load_pool
from tests.compose_file import compose
from tests.support import ROOT

COMPOSE = compose()  # with the defaults a user gets
MATRIX = load_matrix(ROOT / "matrix.toml")
RUN_ID = "run1"
MEMORY_PEAK = 123_456_789  # what the records server's /metrics reports
SERVICE_IP = "172.18.0.9"


def compose_images() -> dict[str, list[str]]:
    """Image name -> Config.Env, as `docker compose --profile services build` makes them (build args)."""
    images = {COMPOSE["services"]["k6"]["image"]: []}
    for service in COMPOSE["services"].values():
        args = service.get("build", {}).get("args", {})
        if "SERVICE" in args:
            images[service["image"]] = [f"PORT={args['PORT']}", f"METRICS_PORT={args['METRICS_PORT']}"]
    return images


def docker_stats(cpu_s: float, periods: int, throttled: int, throttled_s: float, **memory: int) -> dict:
    """A stats sample whose CPU time is 70% user, 30% kernel mode."""
    return {
        "cpu_stats": {
            "cpu_usage": {
                "total_usage": round(cpu_s * 1e9),
                "usage_in_usermode": round(cpu_s * 0.7e9),
                "usage_in_kernelmode": round(cpu_s * 0.3e9),
            },
            "throttling_data": {
                "periods": periods,
                "throttled_periods": throttled,
                "throttled_time": round(throttled_s * 1e9),
            },
        },
        "memory_stats": memory,
    }


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
        self.attrs: dict[str, Any] = {
            "State": {"Status": "created", "ExitCode": 0},
            "NetworkSettings": {},
            "HostConfig": {"CpuPeriod": params.get("cpu_period"), "CpuQuota": params.get("cpu_quota")},
        }

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

    def update(self, **resources: Any) -> None:
        """What a running container's limits become; the engine's HostConfig keys."""
        self.client.calls.append(("update", self.name, resources))
        self.attrs["HostConfig"]["CpuQuota"] = resources.get(
            "cpu_quota", self.attrs["HostConfig"]["CpuQuota"]
        )

    def stop(self, timeout: int) -> None:
        self.client.calls.append(("stop", self.name, timeout))
        self.client.stopped_on[self.name] = threading.current_thread().name
        self.client.on_stop(self)
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
        self.on_stop: Callable[[FakeContainer], None] = lambda container: None
        self.stopped_on: dict[str, str] = {}  # container name -> the thread that stopped it
        self.got: list[str] = []  # names asked for through this client's containers.get
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
        self.got.append(name)
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


# --- What the tests build a backend from --------------------------------------------------------


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


def network_scenario(network: str | NetworkProfile, target: str = "aiohttp-h1") -> Scenario:
    if isinstance(network, NetworkProfile):
        return dataclasses.replace(scenario(target), network=network)
    overrides = Overrides(targets=(target,), profiles=("p1",), networks=(network,))
    return expand(MATRIX, "docker", overrides=overrides).scenarios[0]


def quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """No polling delay, no CPU calibration, and the defaults a user gets: CI exports
    tests/docker/substitutes.env (K6_IMAGE, SERVICE_NOFILE)."""
    monkeypatch.setattr("labrunner.backends.docker.stats._K6_POLL_S", 0.0)
    monkeypatch.setattr("labrunner.backends.docker.services._POLL_S", 0.01)
    # The CPU calibration around a session (about 3 s) is not under test here, as in the ladder and
    # precision session tests; the e2e runs calibrate for real.
    monkeypatch.setattr("labrunner.run.calibration.calibrate", lambda cpus, when, say, rounds, attempts: {})
    for variable in ("K6_IMAGE", "SERVICE_NOFILE"):
        monkeypatch.delenv(variable, raising=False)


# --- A scenario through the runner: a real HTTP server behind the published ports ------------------


class RecordsServer(BaseHTTPRequestHandler):
    """Stands in for a REST service behind its published ports: health, records and metrics."""

    protocol_version = "HTTP/1.1"  # what the verifier must see negotiated

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            body = {"status": "SERVING"}
        elif url.path == "/records":
            # The pool's first records, as a lab server answers (count, offset=0): what verification
            # compares a service's records with.
            count = int(parse_qs(url.query)["count"][0])
            pool = load_pool(DEFAULT_POOL_SIZE, DEFAULT_SEED)
            body = {"records": list(itertools.islice(itertools.cycle(pool), count))}
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


@contextlib.contextmanager
def records_published(fake: "FakeDocker") -> Iterator["FakeDocker"]:
    """A real HTTP server behind the fake's published ports: health and verification pass."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordsServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.host_port = server.server_port
    yield fake
    server.shutdown()
    server.server_close()


def run_config(tmp_path: Path) -> SessionConfig:
    return SessionConfig(
        run=runner.RunConfig(
            run_id=RUN_ID,
            out_dir=tmp_path / "out",
            targets_dir=tmp_path / "targets",
            influxdb_url="http://127.0.0.1:8086",
            prometheus_url=None,
        ),
        resume=False,
        argv=("run_matrix.py",),
        backend_reason="test",
        provenance={},
    )


def run_session(tmp_path: Path, engine: "FakeDocker", plan: Plan, **config: Any) -> tuple[bool, list[str]]:
    """A whole session of `plan` on the docker backend over `engine` (the finisher on a client that
    shares its records), with run_config's settings changed by `config`: whether all went well, and
    every line it said."""
    lines: list[str] = []
    client = FakeDocker()
    client.created, client.removed = engine.created, engine.removed
    backend = DockerBackend(settings(tmp_path), engine, say=lambda line: None, finisher_client=client)
    session_config = dataclasses.replace(run_config(tmp_path), **config)
    ok = session.run_plan(plan, session_config, backend, settings(tmp_path), say=lines.append)
    return ok, lines


def flow_plan(repeats: int = 1) -> Plan:
    overrides = Overrides(
        targets=("aiohttp-h1",),
        counts=(3,),
        load_models=("closed",),
        duration="2s",
        warmup="1s",
        repeats=repeats,
    )
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


def k6_writes_its_summary(container: FakeContainer, requests: int = 200) -> None:
    """What k6 does in its container: its summary, in the results directory mounted from this host."""
    host = next(h for h, m in container.params["volumes"].items() if m["bind"] == "/results")
    summary = container.params["environment"]["SUMMARY_FILE"].replace("/results", host)
    Path(summary).write_text(json.dumps(k6_summary(requests)))
