"""The docker backend's containers on a thin fake client (tests/docker_fake.py): the service's
parameters per profile, TLS material, k6's paths, a service that does not start, missing images,
leftovers, a Ctrl-C during a create (with a server behind the published ports:
tests/integration/test_docker_flow.py)."""

import stat
from pathlib import Path

import pytest
from docker.errors import NotFound
from docker.types import Ulimit
from labrunner.backends.base import BackendUnavailable, ScenarioFailed
from labrunner.backends.docker import DockerBackend
from labrunner.run.k6.invocation import K6Setup

from tests.docker_fake import RUN_ID, FakeDocker, scenario, settings
from tests.support import ROOT

pytestmark = pytest.mark.usefixtures("docker_quick_polls")


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
            "SHAPE": "cars",
            "COMPRESSION": "identity",
            "SHUTDOWN_DRAIN_SECONDS": "0",
            "SHUTDOWN_GRACE_SECONDS": "1",
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
        "SHAPE": "cars",
        "COMPRESSION": "identity",
        "SHUTDOWN_DRAIN_SECONDS": "0",
        "SHUTDOWN_GRACE_SECONDS": "1",
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
    invocation = K6Setup(
        target,
        handle,
        run_id=RUN_ID,
        root=ROOT,
        ca_file=tmp_path / "certs" / "ca.pem",
        k6_dir=tmp_path / "out" / "k6",
        log_file=tmp_path / "out" / "logs" / "grpc.k6.log",
        influxdb_url=None,
    ).warmup()
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


# --- Defects found under a real engine (issue 12) --------------------------------------------------


@pytest.mark.parametrize("role", ["service", "k6"])
def test_a_ctrl_c_during_a_containers_create_leaves_no_container(
    role: str, fake: FakeDocker, tmp_path: Path
) -> None:
    fake.interrupt_create_of = role
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        handle = backend.start_service(scenario("grpc"))
        invocation = K6Setup(
            scenario("grpc"), handle, run_id=RUN_ID, root=ROOT, ca_file=tmp_path / "ca.pem",
            k6_dir=tmp_path / "out" / "k6", log_file=tmp_path / "out" / "logs" / "k6.log", influxdb_url=None,
        ).window()  # fmt: skip
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
