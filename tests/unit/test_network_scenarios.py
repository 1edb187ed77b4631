"""Network scenarios without a link: the matrix's [networks], ids, --network, results, no root."""

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends import local
from labrunner.backends.base import BackendSettings, ScenarioFailed
from labrunner.backends.local import network as local_network
from labrunner.cli import run_matrix as cli
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import LOOPBACK, Overrides
from labrunner.model.schema import MatrixError
from labrunner.network import namespaces
from labrunner.results.store import scenario_dict

from tests.support import ROOT

MATRIX = ROOT / "matrix.toml"


@pytest.fixture(scope="module")
def matrix_data() -> dict[str, Any]:
    return tomllib.loads(MATRIX.read_text())


# matrix.toml's units, read here by hand: durations in ms or s, rates in bit/s (decimal), loss in %.
SECONDS = {"ms": 1e-3, "s": 1.0}
BITS_PER_SECOND = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def _quantity(text: str, units: dict[str, float]) -> float:
    number = re.fullmatch(r"([\d.]+)([a-z]+)", text)
    assert number, text
    return float(number[1]) * units[number[2]]


def test_repo_matrix_networks(matrix_data: dict[str, Any]) -> None:
    """Every [networks.*] table loads, in its order; its delay is one way, so the RTT is twice it."""
    networks = load_matrix(MATRIX).networks
    tables = matrix_data["networks"]
    assert list(networks) == list(tables) and "loopback" in tables and len(tables) > 1
    for name, table in tables.items():
        network = networks[name]
        assert set(table) <= {"delay", "jitter", "loss", "rate"}, name
        delay = _quantity(table.get("delay", "0ms"), SECONDS)
        assert network.delay_s == pytest.approx(delay) and network.rtt_s == pytest.approx(2 * delay), name
        assert network.jitter_s == pytest.approx(_quantity(table.get("jitter", "0ms"), SECONDS)), name
        assert network.loss_percent == pytest.approx(float(table.get("loss", "0%").rstrip("%"))), name
        rate = table.get("rate")
        assert network.rate_bps == (None if rate is None else _quantity(rate, BITS_PER_SECOND)), name
        assert network.emulated == bool(table), name  # any condition needs the namespaces


def test_loopback_is_the_default_and_keeps_the_ids() -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc",)))
    [scenario] = plan.scenarios
    assert scenario.network == LOOPBACK and scenario.id == "grpc.small.c100.closed.r1"


def test_network_preset_runs_the_tls_targets_over_every_profile() -> None:
    plan = expand(load_matrix(MATRIX), "local", "network")
    pairs = {(s.target.name, s.network.name) for s in plan.scenarios}
    targets = {"aiohttp-h1-tls", "quart-h1-tls", "quart-h2-tls", "grpc-tls"}
    networks = {"loopback", "lan", "wan", "lossy", "narrow"}
    assert pairs == {(t, n) for t in targets for n in networks}
    # The closed and the open model: equal VUs, and an equal offered rate.
    assert {s.load_model.name for s in plan.scenarios} == {"closed", "open"}
    assert len(plan.scenarios) == 40
    ids = {s.id for s in plan.scenarios}
    assert "grpc-tls.small.c100.closed.r1" in ids and "grpc-tls.small.c100.closed.wan.r1" in ids
    assert "grpc-tls.small.c100.open.wan.r1" in ids
    assert max(s.duration_s for s in plan.scenarios) <= 10


def test_network_override_and_unknown_names() -> None:
    matrix = load_matrix(MATRIX)
    plan = expand(matrix, "local", "ci", Overrides(targets=("grpc-tls",), networks=("wan", "narrow")))
    assert [s.id for s in plan.scenarios] == [
        "grpc-tls.small.c100.closed.wan.r1",
        "grpc-tls.small.c100.closed.narrow.r1",
    ]
    with pytest.raises(MatrixError, match="unknown network 'moon'"):
        expand(matrix, "local", "ci", Overrides(networks=("moon",)))


def test_cli_network_option(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["--backend", "local", "--preset", "ci", "--target", "grpc", "--network", "lan,wan", "--dry-run"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "grpc.small.c100.closed.lan.r1" in out and "grpc.small.c100.closed.wan.r1" in out


def test_a_matrix_without_networks_runs_on_loopback(matrix_data: dict[str, Any]) -> None:
    data = copy.deepcopy(matrix_data)
    del data["networks"]
    data["defaults"].pop("networks")
    del data["presets"]["network"]
    del data["presets"]["compression"]  # the presets that name a network
    del data["presets"]["http3"]
    matrix = parse_matrix(data, MATRIX)
    assert list(matrix.networks) == ["loopback"]
    assert {s.network for s in expand(matrix, "local", "ci").scenarios} == {LOOPBACK}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"delay": "-5ms"}, r"\[networks.wan\] delay: .*must not be negative"),
        ({"loss": "101%"}, r"\[networks.wan\] loss: .*between 0% and 100%"),
        ({"delay": "25 parsecs"}, r"\[networks.wan\] delay: unknown unit"),
        ({"latency": "25ms"}, r"\[networks.wan\]: unknown key 'latency'"),
    ],
)
def test_bad_network_values_name_the_key(
    matrix_data: dict[str, Any], table: dict[str, str], message: str
) -> None:
    data = copy.deepcopy(matrix_data)
    data["networks"]["wan"] = table
    with pytest.raises(MatrixError, match=message):
        parse_matrix(data, MATRIX)


def test_result_scenario_names_its_network() -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc-tls",), networks=("wan",)))
    network = scenario_dict(plan.scenarios[0])["network"]
    assert network["name"] == "wan" and network["rtt_s"] == pytest.approx(0.05)


def test_without_root_a_network_scenario_fails_in_phase_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real check of the backend (network/namespaces.py's require_net_admin), in a process
    # that is not root: the tests may run as root, so the effective uid is what is faked.
    settings = BackendSettings("unit", ROOT, tmp_path, tmp_path / "logs", Path("/nonexistent/k6"), 5.0, 5.0)
    backend = local.LocalBackend(settings)
    monkeypatch.setattr(namespaces.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(namespaces.shutil, "which", lambda name: f"/usr/sbin/{name}")  # iproute2 is there
    monkeypatch.setattr(local.LocalBackend, "_cgroup", lambda self, scenario, notes: None)
    spawned: list[object] = []
    monkeypatch.setattr(local.LocalBackend, "_spawn", lambda *args, **kwargs: spawned.append(args))

    def create_link(link: object) -> None:
        pytest.fail(f"a check that let a process without root through made a link: {link}")

    monkeypatch.setattr(local_network, "create_link", create_link)
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc-tls",), networks=("wan",)))
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(plan.scenarios[0])
    assert failed.value.phase == "network"
    assert re.search(r"\bneed root\b.*CAP_NET_ADMIN", failed.value.message), failed.value.message
    assert spawned == []  # the service never started
