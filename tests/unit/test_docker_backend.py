"""The docker backend on a thin fake client (tests/docker_fake.py): container parameters, cleanup,
usage, auto selection (with a server behind the published ports: tests/integration/test_docker_flow.py)."""

import json
import re
import socket
import stat
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from docker.types import Ulimit
from labrunner import backends
from labrunner.backends import docker_names, docker_network_helper
from labrunner.backends.base import BackendUnavailable, ScenarioFailed
from labrunner.backends.docker_backend import DockerBackend
from labrunner.backends.docker_stats import (
    StatsSnapshot,
    UsageWindow,
    memory_peak_from_metrics,
    usage_from_stats,
)
from labrunner.cli import run_matrix as cli
from labrunner.network.profiles import NetworkProfile
from labrunner.run import k6

from tests.docker_fake import (
    COMPOSE,
    MATRIX,
    RUN_ID,
    SERVICE_IP,
    FakeContainer,
    FakeDocker,
    docker_stats,
    network_scenario,
    quick_polls_and_compose_defaults,
    scenario,
    settings,
)
from tests.support import ROOT


@pytest.fixture
def fake() -> FakeDocker:
    return FakeDocker()


@pytest.fixture(autouse=True)
def _quick_polls_and_compose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_polls_and_compose_defaults(monkeypatch)


# --- Container parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "quota_at_start", "quota", "memory", "service_cpus", "k6_cpus"),
    [
        ("p1", 200_000, 200_000, 2 * 2**30, "6,7", "0,1,2,3,4,5"),
        ("p2", 400_000, 400_000, 4 * 2**30, "4,5,6,7", "0,1,2,3"),
        ("small", 100_000, 50_000, 512 * 2**20, "7", "0,1,2,3,4,5,6"),
    ],
)
def test_service_container_parameters_per_profile(
    tmp_path: Path,
    fake: FakeDocker,
    profile: str,
    quota_at_start: int,
    quota: int,
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
        "cpu_period": 100_000,
        "cpu_quota": quota_at_start,
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
    # The profile's quota once the service listens (its whole CPUs' until then), as the engine holds it.
    assert [call for call in fake.calls if call[0] == "update"] == [
        ("update", container.name, {"cpu_quota": quota})
    ]
    assert container.attrs["HostConfig"] == {"CpuPeriod": 100_000, "CpuQuota": quota}
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


# --- A service that does not start, missing images, leftovers -----------------------------------


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
    usage = usage_from_stats(UsageWindow(before, after, 3.0, None), 0.5, 0, "tail")
    assert usage.window_seconds == 3.0
    assert usage.cpu_seconds == pytest.approx(1.5)
    assert usage.user_cpu_seconds == pytest.approx(1.05) and usage.system_cpu_seconds == pytest.approx(0.45)
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
    assert usage_from_stats(UsageWindow(before, after, 1.0, 400), 1.0, 0, "").memory_peak_bytes == 400
    no_peak = usage_from_stats(UsageWindow(before, after, 1.0, None), 1.0, 0, "")
    assert (no_peak.memory_peak_bytes, no_peak.memory_peak_scope) == (None, None)
    assert memory_peak_from_metrics("x 1\nprotolab_cgroup_memory_peak_bytes 1.5e+08\n") == 150_000_000


def test_usage_without_a_measured_window() -> None:
    usage = usage_from_stats(None, 2.0, 137, "killed")
    assert (usage.window_seconds, usage.cpu_seconds, usage.exit_code, usage.log_tail) == (
        None,
        None,
        137,
        "killed",
    )


# --- Names -------------------------------------------------------------------------------------


def test_container_names_are_unique_dns_labels() -> None:
    assert docker_names.container_name("20250101-120000", "quart-h2-tls.p1.c100.closed.r1") == (
        "protolab-20250101-120000-quart-h2-tls-p1-c100-closed-r1"
    )
    long_a = docker_names.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r10"
    )
    long_b = docker_names.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r11"
    )
    assert long_a != long_b
    for name in (long_a, long_b):
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower(), name


def test_names_agree_with_docker_compose() -> None:
    services = COMPOSE["services"]
    assert COMPOSE["networks"]["default"]["name"] == docker_names.NETWORK
    assert COMPOSE["volumes"]["certs"]["name"] == docker_names.CERTS_VOLUME
    k6 = services["k6"]
    assert k6["image"] == docker_names.K6_IMAGE
    assert k6["environment"]["K6_OUT"] == f"influxdb=http://{docker_names.INFLUXDB_IN_NETWORK}/myk6db"
    assert {"./k6:/k6:ro", "./proto:/proto:ro", "certs:/certs:ro"} <= set(k6["volumes"])
    assert k6["environment"]["SSL_CERT_FILE"] == "/certs/ca.pem"
    built = {name: s for name, s in services.items() if "SERVICE" in s.get("build", {}).get("args", {})}
    assert {t.service for t in MATRIX.targets.values()} <= {
        s["build"]["args"]["SERVICE"] for s in built.values()
    }
    for name, service in built.items():
        module = service["build"]["args"]["SERVICE"]
        assert (docker_names.compose_name(module), docker_names.image_name(module)) == (
            name,
            service["image"],
        )
        # The runner's containers are hardened like compose's services under test.
        hardening = {key: service[key] for key in ("init", "read_only", "cap_drop", "security_opt")}
        assert {**hardening, "tmpfs": dict.fromkeys(service["tmpfs"], "")} == docker_names.SERVICE_HARDENING
        assert int(service["ulimits"]["nofile"]) == docker_names.NOFILE
        assert service["volumes"] == [f"certs:{docker_names.CERTS_DIR}:ro"]
        assert service["mem_limit"] == service["memswap_limit"]


# --- Choosing the backend ----------------------------------------------------------------------


def test_auto_picks_docker_when_the_engine_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDocker()
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    assert backends.choose("auto") == ("docker", "auto: Docker engine 27.5.1 answers and the lab is up")
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
        "auto: Docker engine 27.5.1 answers but the lab is not up (no protolab network): "
        "run `docker compose up -d`",
    )
    assert ("close",) in fake.calls


def test_auto_falls_back_to_local_and_says_why_in_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real SDK against a socket that is not there, then one nobody listens on: the reason is
    # a sentence, not the SDK's wrapped exception ("Error while fetching server API version: ...").
    missing = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", missing)
    assert cli.main(["--dry-run", "--target", "grpc"]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line == (
        f"backend: local (auto): no Docker engine answered at {missing} (no socket at that path)"
    )
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(tmp_path / "refusing.sock"))  # bound, never listening: connect is refused
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/refusing.sock")
        assert backends.choose("auto") == (
            "local",
            f"auto: no Docker engine answered at unix://{tmp_path}/refusing.sock (connection refused)",
        )


def test_backend_docker_without_an_engine_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real SDK against a socket nobody listens on.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    socket_url = f"unix://{tmp_path}/no-engine.sock"
    with pytest.raises(
        BackendUnavailable,
        match=rf"^--backend docker: service engine local \({re.escape(socket_url)}\) did not answer: "
        "no socket at that path; start Docker or use --backend local$",
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
    script = "\n".join(
        " ".join(c) for c in docker_network_helper.tc_commands(network_scenario("wan").network)
    )
    assert docker_network_helper.tc_commands(network_scenario("wan").network) == [
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
    assert docker_network_helper.tc_commands(NARROW_RATE) == [
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
    assert docker_network_helper.tc_commands(narrow) == [
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
    inputs = docker_network_helper.helper_inputs(
        dockerfile, "python:3.11.15-slim-bookworm", ""
    )  # not pulled yet
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
        "protolab.inputs": docker_network_helper.helper_inputs(
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
    assert helper_default[1] == services_default[1] == docker_network_helper.PYTHON_IMAGE
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}$", helper, re.MULTILINE)
    assert re.search(r"apt-get install .*\biproute2\b", helper)
