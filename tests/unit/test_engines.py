"""Roles mapped to Docker engines (issue 15): [hosts] and the engine options, how an engine is
reached (the real Docker SDK against sockets nobody listens on), the extra certificate name, and
the docker backend's placement of k6 on load engines (on the thin fake client of
tests/docker_fake.py). The live two-engine run is tests/e2e/test_docker_engines.py's."""

import copy
import dataclasses
import io
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from docker.context import ContextAPI
from labrunner import certs
from labrunner.backends.base import BackendUnavailable, ScenarioFailed
from labrunner.backends.docker import DockerBackend
from labrunner.backends.docker import backend as docker_backend
from labrunner.backends.docker import k6 as docker_k6
from labrunner.backends.engines import Engine, connect
from labrunner.cli import run_matrix as cli
from labrunner.model.engine_roles import Hosts
from labrunner.model.matrix import parse_matrix
from labrunner.model.schema import MatrixError
from labrunner.run.k6.invocation import K6Setup

from tests.docker_fake import FakeDocker, docker_stats, network_scenario, scenario, settings
from tests.support import ROOT

MATRIX = ROOT / "matrix.toml"


@pytest.fixture(scope="module")
def matrix_data() -> dict[str, Any]:
    return tomllib.loads(MATRIX.read_text())


def _with_hosts(data: dict[str, Any], **hosts: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    changed["hosts"] = hosts
    return changed


# --- [hosts] and the command line -------------------------------------------------------------


def test_without_hosts_both_roles_use_the_local_engine(matrix_data: dict[str, Any]) -> None:
    hosts = parse_matrix(matrix_data, MATRIX).hosts
    assert hosts == Hosts("local", ("local",), "127.0.0.1")
    assert hosts.default


def test_hosts_table_names_engines_per_role(matrix_data: dict[str, Any]) -> None:
    data = _with_hosts(
        matrix_data,
        service="lab-a",
        load=["ssh://k6@10.0.0.7", "tcp://10.0.0.8:2376"],
        publish_address="10.0.0.5",
    )
    hosts = parse_matrix(data, MATRIX).hosts
    assert hosts == Hosts("lab-a", ("ssh://k6@10.0.0.7", "tcp://10.0.0.8:2376"), "10.0.0.5")
    one = parse_matrix(_with_hosts(matrix_data, load="unix:///run/b.sock"), MATRIX).hosts
    assert one.load == ("unix:///run/b.sock",)  # one engine stands for a list of one


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ({"load": ["ftp://x"]}, "[hosts] load: 'ftp://x' is not an engine"),
        ({"service": "tcp://"}, "[hosts] service: 'tcp://' is not an engine"),
        ({"load": []}, "[hosts]: load must name at least one engine"),
        ({"load": ["b", "b"]}, "[hosts]: load names an engine twice: b, b"),
        ({"publish_address": "0.0.0.0"}, "[hosts] publish_address: '0.0.0.0': give the IPv4 address"),
        ({"publish_address": "::1"}, "[hosts] publish_address: '::1': give the IPv4 address"),
        ({"publish_address": "lab.example"}, "[hosts] publish_address: 'lab.example' is not an IPv4 address"),
        ({"engine": "x"}, "unknown key 'engine'"),
    ],
)
def test_bad_hosts_are_refused_naming_the_key(
    matrix_data: dict[str, Any], hosts: dict[str, Any], message: str
) -> None:
    with pytest.raises(MatrixError) as refused:
        parse_matrix(_with_hosts(matrix_data, **hosts), MATRIX)
    assert message in str(refused.value)


def test_engine_options_override_the_table_and_auto_takes_docker(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--dry-run", "--preset", "ci", "--target", "grpc", "--load-engine", "unix:///run/b.sock"]
    assert cli.main(argv) == 0
    assert (
        "backend: docker (auto): [hosts] or the engine options name Docker engines" in capsys.readouterr().out
    )
    assert cli.main([*argv, "--publish-address", "localhost"]) == cli.EXIT_USAGE
    assert "publish_address: 'localhost' is not an IPv4 address" in capsys.readouterr().err


def test_the_local_backend_refuses_engines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--backend", "local", "--preset", "ci", "--target", "grpc", "--load-engine", "b"]
    assert cli.main([*argv, "--k6", "/bin/true", "--out", str(tmp_path / "out")]) == cli.EXIT_USAGE
    assert "name Docker engines: use them with --backend docker" in capsys.readouterr().err
    # A [hosts] table does not stop a local run: it names Docker engines, which it does not use.
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(MATRIX.read_text() + '\n[hosts]\nload = ["unix:///run/b.sock"]\n')
    dry = ["--dry-run", "--backend", "local", "--matrix", str(matrix), "--preset", "ci"]
    assert cli.main(dry) == 0
    assert "backend: local (requested)" in capsys.readouterr().out


# --- Reaching an engine -----------------------------------------------------------------------


def test_an_engine_that_does_not_answer_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    silent = f"unix://{tmp_path}/service.sock"
    no_socket = rf"^load engine {silent} did not answer: no socket at that path$"
    with pytest.raises(BackendUnavailable, match=no_socket):
        connect(silent, "load", timeout_s=5)
    argv = ["--backend", "docker", "--preset", "ci", "--target", "grpc", "--service-engine", silent]
    assert cli.main([*argv, "--k6", "/bin/true", "--out", str(tmp_path / "out")]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: --backend docker: service engine {silent} did not answer" in err
    assert not (tmp_path / "out" / "scenarios").exists()  # nothing ran


def test_a_docker_context_is_resolved_to_its_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "config"))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.json").write_text("{}")
    silent = f"unix://{tmp_path}/load.sock"
    ContextAPI.create_context("lab-b", host=silent)
    with pytest.raises(BackendUnavailable, match=rf"^load engine lab-b \({silent}\) did not answer"):
        connect("lab-b", "load", timeout_s=5)
    with pytest.raises(BackendUnavailable, match=r"^load engine nowhere: no Docker context of that name"):
        connect("nowhere", "load", timeout_s=5)


def test_the_certificate_names_an_extra_publish_address(tmp_path: Path) -> None:
    certs.ensure_certs(tmp_path)
    assert "10.0.0.5" not in certs.server_names(tmp_path)
    assert certs.problem(tmp_path, ["10.0.0.5"]) == "server.pem lacks SANs ['10.0.0.5']"
    assert certs.ensure_certs(tmp_path, extra=["10.0.0.5"]) is True  # regenerated with it
    assert {"10.0.0.5", "127.0.0.1", "grpc-aio"} <= certs.server_names(tmp_path)
    assert certs.main(["--dir", str(tmp_path), "--san", "10.0.0.5", "--san", ""]) == 0  # kept
    assert certs.problem(tmp_path, ["10.0.0.5"]) is None


# --- k6 on load engines -------------------------------------------------------------------------


def _apart(tmp_path: Path, *load: Engine, service: FakeDocker | None = None) -> DockerBackend:
    roles = Hosts("local", tuple(engine.name for engine in load), "127.0.0.1")
    lab_settings = dataclasses.replace(settings(tmp_path), hosts=roles)
    return DockerBackend(lab_settings, service or FakeDocker(), say=lambda line: None, load=load)


def test_instances_take_the_load_engines_cpus_in_turn(tmp_path: Path) -> None:
    two, three = FakeDocker(ncpu=2), FakeDocker(ncpu=3)
    backend = _apart(tmp_path, Engine("b", "unix:///b.sock", two), Engine("c", "unix:///c.sock", three))
    handle = backend.start_service(scenario("grpc"))
    assert handle.k6_cpus == (0, 1, 2, 3, 4)
    assert handle.k6_places == tuple(
        f"engine {name} CPU {cpu}" for name, cpu in (("b", 0), ("c", 0), ("b", 1), ("c", 1), ("c", 2))
    )
    assert (handle.k6_address.host, handle.k6_address.port) == ("127.0.0.1", handle.address.port)
    assert (
        backend.cpus_elsewhere
        == "k6 runs on load engine(s) b, c, apart from the service: their CPUs are not read"
    )
    backend.check_k6_instances(scenario("grpc").profile, 5)
    with pytest.raises(BackendUnavailable, match=r"needs 6 CPUs .*the load engines b, c have 5 CPUs for k6"):
        backend.check_k6_instances(scenario("grpc").profile, 6)
    backend.close()


def test_an_emulated_network_needs_k6_beside_the_service(tmp_path: Path) -> None:
    service = FakeDocker()
    backend = _apart(tmp_path, Engine("b", "unix:///b.sock", FakeDocker(ncpu=2)), service=service)
    with pytest.raises(
        ScenarioFailed, match=r"^network: network wan: k6 on other engines reaches the service"
    ):
        backend.start_service(network_scenario("wan"))
    assert service.created == []


def test_a_remote_service_engine_says_its_cpus_are_not_read_here(tmp_path: Path) -> None:
    fake = FakeDocker()
    remote = DockerBackend(settings(tmp_path), fake, say=lambda line: None, service_url="tcp://10.0.0.5:2376")
    assert (
        remote.cpus_elsewhere
        == "the Docker engine at tcp://10.0.0.5:2376 is not this host: its CPUs cannot be read here"
    )
    here = DockerBackend(
        settings(tmp_path), fake, say=lambda line: None, service_url="unix:///var/run/docker.sock"
    )
    assert here.cpus_elsewhere is None


def test_instances_beside_the_service_each_get_a_container_and_a_cpu(tmp_path: Path) -> None:
    fake = FakeDocker(ncpu=8)
    fake.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    target = scenario("grpc")
    handle = backend.start_service(target)
    invocation = K6Setup(
        target, handle, run_id="run1", root=ROOT, ca_file=tmp_path / "ca.pem", k6_dir=tmp_path / "out" / "k6",
        log_file=tmp_path / "out" / "logs" / "k6.log", influxdb_url=None, instances=2,
    ).window()  # fmt: skip
    processes = backend.run_k6_instances(handle, invocation.instances, measured=True)
    k6_params = [c.params for c in fake.created if c.role == "k6"]
    assert [p["name"] for p in k6_params] == [f"{fake.created[0].name}-k6-1", f"{fake.created[0].name}-k6-2"]
    assert [p["cpuset_cpus"] for p in k6_params] == [str(cpu) for cpu in handle.k6_cpus[:2]]
    assert all(p["network"] == "protolab" for p in k6_params)
    for index, params in enumerate(k6_params, start=1):  # raw samples where the mount puts them
        assert f"csv=/results/{target.id}.measure.k6-{index}.csv" in params["command"]
    assert [(p.cpus, p.placement) for p in processes] == [(1, None), (1, None)]
    backend.close()
    assert {c.name for c in fake.created} <= set(fake.removed)


def test_k6_on_a_load_engine_gets_its_files_in_and_its_results_out(tmp_path: Path) -> None:
    load = FakeDocker(ncpu=2)
    stem = f"{scenario('grpc-tls').id}.measure"  # the measured window's files
    load.k6_results = {f"/results/{stem}.k6-1.json": b'{"metrics": {}}', f"/results/{stem}.k6-1.csv": b"raw"}
    lab = dataclasses.replace(settings(tmp_path), hosts=Hosts("local", ("b",), "10.0.0.5"))
    service = FakeDocker()
    service.service_stats = [docker_stats(1.0, 0, 0, 0), docker_stats(2.0, 0, 0, 0)]
    backend = DockerBackend(lab, service, say=lambda line: None, load=[Engine("b", "unix:///b.sock", load)])
    target = scenario("grpc-tls")
    for extra, volume in (([], "lab"), (["10.0.0.5"], "published")):
        certs.generate(tmp_path / volume, extra)
        service.volume_files = {n: (tmp_path / volume / n).read_bytes() for n in ("ca.pem", "server.pem")}
        if not extra:
            with pytest.raises(ScenarioFailed, match=r"does not name the publish address 10.0.0.5"):
                backend.start_service(target)
    handle = backend.start_service(target)
    assert str(handle.k6_address) == str(handle.address) == f"10.0.0.5:{service.host_port}"
    invocation = K6Setup(
        target, handle, run_id="run1", root=ROOT, ca_file=tmp_path / "certs" / "ca.pem",
        k6_dir=tmp_path / "out" / "k6", log_file=tmp_path / "out" / "logs" / "k6.log",
        influxdb_url="http://127.0.0.1:8086", instances=2,
    ).window()  # fmt: skip
    processes = backend.run_k6_instances(handle, invocation.instances, measured=True)
    [first, second] = [c for c in load.created if c.role == "k6"]
    assert {c.role for c in service.created} == {"service"}  # no k6 beside the service
    for container, cpu in ((first, "0"), (second, "1")):
        params = container.params
        assert (params["network_mode"], params["cpuset_cpus"]) == ("host", cpu)
        assert "volumes" not in params and "network" not in params
        assert "--out" in params["command"] and "influxdb=http://10.0.0.5:8086/myk6db" in params["command"]
        with tarfile.open(fileobj=io.BytesIO(container.archive)) as tar:
            names = {member.name: member for member in tar.getmembers()}
        assert {"k6/rest.js", "k6/grpc_unary.js", "proto/cars.proto", "certs/ca.pem"} <= set(names)
        assert names["results"].isdir() and names["results"].mode == 0o1777
    # The first instance's summary and raw samples came out; the second wrote none.
    assert (tmp_path / "out" / "k6" / f"{stem}.k6-1.json").read_bytes() == b'{"metrics": {}}'
    assert (tmp_path / "out" / "k6" / f"{stem}.k6-1.csv").read_bytes() == b"raw"
    assert not (tmp_path / "out" / "k6" / f"{stem}.k6-2.json").exists()
    assert [p.placement for p in processes] == ["engine b CPU 0", "engine b CPU 1"]
    backend.close()
    assert {c.name for c in load.created} <= set(load.removed)


def test_k6s_influxdb_output_follows_where_k6_runs() -> None:
    at = docker_k6._influxdb_at
    beside = at("influxdb=http://127.0.0.1:8086/myk6db", "influxdb", "8086")
    assert beside == "influxdb=http://influxdb:8086/myk6db"
    # On another engine: this host's publish address, on the URL's own port.
    assert at("influxdb=http://localhost:18086/myk6db", "10.0.0.5") == "influxdb=http://10.0.0.5:18086/myk6db"
    assert at("influxdb=http://10.0.0.9:8086/myk6db", "10.0.0.5") == "influxdb=http://10.0.0.9:8086/myk6db"
    assert at("csv=/results/s.csv", "10.0.0.5") == "csv=/results/s.csv"


def test_the_same_engine_named_twice_is_one_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = {"unix:///var/run/docker.sock": FakeDocker(), "unix:///b.sock": FakeDocker(ncpu=2)}
    urls = {
        "local": "unix:///var/run/docker.sock",
        "unix:///var/run/docker.sock": "unix:///var/run/docker.sock",
    }
    monkeypatch.setattr(
        docker_backend,
        "connect_engine",
        lambda name, role, timeout_s: Engine(name, urls.get(name, name), fakes[urls.get(name, name)]),
    )
    same = dataclasses.replace(settings(tmp_path), hosts=Hosts("local", ("unix:///var/run/docker.sock",)))
    assert docker_backend.create(same, say=lambda line: None).start_service(scenario("grpc")).k6_places == ()
    apart = dataclasses.replace(settings(tmp_path), hosts=Hosts("local", ("unix:///b.sock",)))
    handle = docker_backend.create(apart, say=lambda line: None).start_service(scenario("grpc"))
    assert handle.k6_places == ("engine unix:///b.sock CPU 0", "engine unix:///b.sock CPU 1")


def test_a_load_engine_on_another_host_needs_a_publish_address(tmp_path: Path) -> None:
    remote = Engine("ssh://k6@10.0.0.8", "ssh://k6@10.0.0.8", FakeDocker())
    with pytest.raises(
        BackendUnavailable, match=r"^load engine ssh://k6@10.0.0.8 is another host: k6 there would"
    ):
        _apart(tmp_path, remote)


def test_the_service_engine_as_a_load_engine_offers_only_what_the_service_leaves(tmp_path: Path) -> None:
    service = FakeDocker(ncpu=2)
    shared = Engine("local", "unix:///var/run/docker.sock", service)
    backend = _apart(tmp_path, shared, Engine("b", "unix:///b.sock", FakeDocker(ncpu=1)), service=service)
    p1 = scenario("grpc").profile  # 2 CPUs: all of the service engine's
    with pytest.raises(BackendUnavailable, match=r"have 1 CPUs for k6 beside profile p1"):
        backend.check_k6_instances(p1, 2)
    small = scenario("grpc", profile="small").profile  # 1 CPU: the other is k6's
    backend.check_k6_instances(small, 2)


def test_a_memory_limit_the_engine_cannot_bind_is_noted(tmp_path: Path) -> None:
    fake = FakeDocker()
    fake.mem_total = 2 * 2**30 - 64 * 2**20  # a 2 GB VM: a little less than 2 GiB
    handle = DockerBackend(settings(tmp_path), fake, say=lambda line: None).start_service(scenario("grpc"))
    assert (
        "profile p1's memory limit (2048 MiB) is not below the engine's memory (1984 MiB)" in handle.notes[0]
    )
