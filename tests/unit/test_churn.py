"""Unit tests: connection churn (a new connection every N calls) as an axis of the matrix: what it plans
and refuses, the ids, k6's env and tags, the duets against connections kept, the check of the
connections k6 dialed, and the fit of CPU per call against 1/N that says what a connection and a TLS
handshake cost."""

import copy
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ScenarioFailed, ServiceHandle
from labrunner.model import duet
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import Overrides, Plan, Scenario
from labrunner.model.schema import MatrixError
from labrunner.report import findings
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.connection_cost import connection_costs, handshakes, microseconds
from labrunner.report.document import Table
from labrunner.report.handshakes import HandshakeCase
from labrunner.report.payload_model import Estimate
from labrunner.report.sections import connections as connections_section
from labrunner.report.sections.findings import forest_rows
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict
from labrunner.run import connections
from labrunner.run.k6.invocation import K6Setup

from tests.support import ROOT, ok_result

MATRIX = ROOT / "matrix.toml"
CHURNED = Overrides(targets=("aiohttp-h1", "grpc-tls"), churn=("never", 1, 10))


def _plan(overrides: Overrides = CHURNED, preset: str = "ci") -> Plan:
    return expand(load_matrix(MATRIX), "local", preset, overrides)


def test_churn_is_an_axis_whose_never_keeps_the_ids_runs_had_before() -> None:
    plan = _plan()
    assert [(s.target.name, s.churn) for s in plan.scenarios] == [
        ("aiohttp-h1", None),
        ("grpc-tls", None),
        ("aiohttp-h1", 1),
        ("grpc-tls", 1),
        ("aiohttp-h1", 10),
        ("grpc-tls", 10),
    ]
    assert [s.group for s in plan.scenarios if s.target.name == "grpc-tls"] == [
        "grpc-tls.small.c100.closed",
        "grpc-tls.small.c100.closed.churn1",
        "grpc-tls.small.c100.closed.churn10",
    ]
    assert [scenario_dict(s)["churn"] for s in plan.scenarios] == [None, None, 1, 1, 10, 10]
    assert plan.notes == ()


def test_churn_runs_one_call_at_a_time_and_says_so_beside_streams() -> None:
    plan = _plan(Overrides(targets=("grpc-tls",), streams=(1, 10), churn=("never", 10)))
    assert sorted((s.streams, s.churn or 0) for s in plan.scenarios) == [(1, 0), (1, 10), (10, 0)]
    assert plan.notes == ("churn 10 runs at 1 stream per connection only (one call at a time)",)


@pytest.mark.parametrize(
    ("churn", "refusal"),
    [
        (0, r"churn 0: a connection carries 1 or more calls before it is replaced, or 'never' to keep it"),
        (-3, r"churn -3: a connection carries 1 or more"),
        (True, r"churn True: a connection carries 1 or more"),
        ("always", r"churn 'always': a connection carries 1 or more"),
    ],
)
def test_the_file_refuses_a_churn_that_is_no_number_of_calls(churn: object, refusal: str) -> None:
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["presets"]["ci"]["churn"] = ["never", churn]
    with pytest.raises(MatrixError, match=refusal):
        parse_matrix(data, MATRIX)


def test_callers_refuse_churn() -> None:
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["presets"]["ci"]["churn"] = [10]
    data["presets"]["ci"]["measure"] = "caller"
    with pytest.raises(MatrixError, match="churn 10: the callers keep their connections"):
        parse_matrix(data, MATRIX)


def _handle() -> ServiceHandle:
    address = Endpoint("127.0.0.1", 8443)
    return ServiceHandle("s", "grpc_aio", address, address, None, None, 1, "cgroup-v1", (1,), (0,))


@pytest.mark.parametrize(("churn", "env", "tag"), [(None, None, "never"), (10, "10", "10")])
def test_k6_gets_churn_in_its_env_and_tags(
    tmp_path: Path, churn: int | None, env: str | None, tag: str
) -> None:
    [scenario] = [s for s in _plan().scenarios if s.target.name == "grpc-tls" and s.churn == churn]
    setup = K6Setup(scenario, _handle(), "r1", ROOT, tmp_path / "ca.pem", tmp_path, tmp_path / "k6.log", None)
    for invocation in (setup.warmup(), setup.window()):
        assert invocation.env.get("CHURN") == env
        assert f"churn={tag}" in list(invocation.args)


def test_the_churn_preset_duets_each_churn_beside_the_same_target_keeping_its_connections() -> None:
    plan = duet.plan_duets(_plan(Overrides(), preset="churn"), duet.AUTO)
    ids = [s.id for s in plan.scenarios]
    assert len(ids) == len(set(ids))
    assert {
        "aiohttp-h1-tls.eighth.c100.closed.churn1.vs-aiohttp-h1-tls",
        "aiohttp-h1-tls.eighth.c100.closed.vs-aiohttp-h1-tls-churn1",
        "grpc.eighth.c100.closed.churn100.vs-grpc",
    } <= {s.group for s in plan.scenarios}
    for unit in plan.run_units:
        a, b = unit
        assert a.duet and b.duet and a.repeat == b.repeat
        assert (a.duet.partner, b.duet.partner) == (b.duet_name, a.duet_name)
        # A block is one target against itself (the A/A control, or a churn against connections kept).
        assert a.target == b.target
        assert a.churn is None or b.churn is None


def test_k6_must_dial_a_new_connection_every_churn_calls() -> None:
    connections.check_churn(10, attempts=1000, opened=100, vus=10)  # each VU's 100 calls: 10 dials
    connections.check_churn(10, attempts=1000, opened=110, vus=10)  # and a last one each never used up
    with pytest.raises(ScenarioFailed, match="k6 dialed 10 connections for 1000 calls on 10 VUs; a new one"):
        connections.check_churn(10, attempts=1000, opened=10, vus=10)  # kept: no churn happened
    with pytest.raises(ScenarioFailed, match="dials 100 to 110"):
        connections.check_churn(10, attempts=1000, opened=1000, vus=10)


# CPU per call in ms: a kept connection's call, and what each new connection adds, by target.
KEPT = {"aiohttp-h1": 0.40, "aiohttp-h1-tls": 0.45, "grpc": 0.90, "grpc-tls": 1.00}
CONNECTION = {"aiohttp-h1": 0.20, "aiohttp-h1-tls": 2.20, "grpc": 0.60, "grpc-tls": 3.10}
# Each repeat's measurement off the line by this share, so the fit has residuals.
NOISE = {1: 1.0, 2: 1.02, 3: 0.98}


def _result(scenario: Scenario) -> dict[str, Any]:
    """A 5 s window whose CPU per call is KEPT + CONNECTION / churn, at 1 CPU second."""
    name = scenario.target.name
    per_call_ms = (KEPT[name] + CONNECTION[name] / (scenario.churn or float("inf"))) * NOISE[scenario.repeat]
    calls = int(1000 / per_call_ms)  # 1 CPU second
    return ok_result(
        scenario,
        requests=calls,
        rps=calls / 5,
        latency_ms={},
        received_bytes=calls * 1000,
        window_s=5.0,
        cpu_seconds=1.0,
        quota_used=1.0,
    )


def _churn_run() -> list[dict[str, Any]]:
    overrides = Overrides(targets=tuple(KEPT), churn=("never", 1, 10, 100))
    plan = duet.plan_duets(_plan(overrides, "churn"), duet.AUTO)
    return [_result(s) for s in plan.scenarios]


def test_the_fit_of_cpu_per_call_against_one_over_n_finds_each_connections_cost() -> None:
    groups = group_results(parse_results(_churn_run()))
    costs = {c.target: c for c in connection_costs(groups)}
    assert set(costs) == set(KEPT)
    for name, cost in costs.items():
        assert cost.churns == (None, 1, 10, 100)
        assert cost.per_connection.value == pytest.approx(CONNECTION[name], rel=0.03)
        assert cost.kept_call.value == pytest.approx(KEPT[name], rel=0.03)
        assert cost.per_connection.low is not None and cost.per_connection.high is not None
        assert cost.per_connection.low < CONNECTION[name] < cost.per_connection.high
    # The TLS handshake: each TLS target's connection over its cleartext twin's.
    found = {(h.tls.target, h.cleartext.target): h.cost for h in handshakes(list(costs.values()))}
    assert set(found) == {("aiohttp-h1-tls", "aiohttp-h1"), ("grpc-tls", "grpc")}
    assert found[("aiohttp-h1-tls", "aiohttp-h1")].value == pytest.approx(2.0, rel=0.05)
    assert found[("grpc-tls", "grpc")].value == pytest.approx(2.5, rel=0.05)


def test_a_run_without_churn_fits_nothing() -> None:
    plan = _plan(Overrides(targets=("aiohttp-h1", "grpc")))
    groups = group_results(parse_results([_result(s) for s in plan.scenarios]))
    assert connection_costs(groups) == []
    assert not [f for f in findings.for_run(groups, "ci") if f.question == "churn" and f.answer]


def test_the_findings_say_what_a_connection_and_a_handshake_cost_and_each_churn_against_kept() -> None:
    groups = group_results(parse_results(_churn_run()))
    found = findings.for_run(groups, "churn")
    answers = [f.sentence for f in found if f.question == "churn" and f.answer]
    assert any(s.startswith("aiohttp-h1-tls: a new connection costs 2,2") and " µs [" in s for s in answers)
    assert any(
        s.startswith("aiohttp-h1-tls: a full TLS handshake costs 2,0")
        and "(its new connection over aiohttp-h1's)" in s
        and s.endswith("k6 never resumes a TLS session.")
        for s in answers
    )
    pairs = [f.sentence for f in found if f.question == "churn" and not f.answer]
    # Every churn against the same target keeping its connections, named by the churn.
    assert any(
        s.startswith("grpc-tls (new connection every call) vs grpc-tls (connections kept): req/s")
        for s in pairs
    )
    kinds = {c.kind for c in compare_groups(groups)}
    assert "new connections vs kept" in kinds
    labels = [label for label, _ in forest_rows(groups)]
    assert len(labels) == len(set(labels))


def test_an_estimate_in_ms_reads_as_microseconds() -> None:
    assert microseconds(Estimate(2.2041, 1.9, 2.5)) == "2,204 µs [1,900, 2,500]"
    assert microseconds(Estimate(0.41, None, None)) == "410 µs"


def test_results_written_before_churn_kept_their_connections() -> None:
    [scenario] = [s for s in _plan().scenarios if s.target.name == "grpc-tls" and s.churn is None]
    old = _result(scenario)
    del old["scenario"]["churn"]
    [result] = parse_results([old])
    assert result.scenario.churn is None


def test_the_report_shows_each_churn_the_fit_and_the_handshakes() -> None:
    groups = group_results(parse_results(_churn_run()))
    report = SimpleNamespace(run=SimpleNamespace(groups=groups), handshakes=())
    assert connections_section.applies(report)
    blocks = connections_section.blocks(report)
    tables = [b for b in blocks if isinstance(b, Table)]
    churns, fits, tls = tables
    assert {row[1] for row in churns.rows} == {"never", "1", "10", "100"}
    assert {row[0] for row in fits.rows} == set(KEPT)
    assert [row[:2] for row in tls.rows] == [("aiohttp-h1-tls", "aiohttp-h1"), ("grpc-tls", "grpc")]
    plain = group_results(parse_results([_result(s) for s in _plan(Overrides(targets=("grpc",))).scenarios]))
    assert not connections_section.applies(SimpleNamespace(run=SimpleNamespace(groups=plain), handshakes=()))


def _handshake_case(service: str, full: float, resumed: float, others: float = 0.01) -> HandshakeCase:
    return HandshakeCase(
        service=service,
        tls_version="TLSv1.3",
        alpn="http/1.1",
        rounds=5,
        handshakes=150,
        warmup=20,
        full_us=Estimate(full, full - 40, full + 40),
        resumed_us=Estimate(resumed, resumed - 45, resumed + 45),
        resumed_over_full=Estimate(resumed / full, resumed / full - 0.07, resumed / full + 0.07),
        no_handshake_us=Estimate(69, 60, 78),
        full_rounds_us=(full,) * 5,
        resumed_rounds_us=(resumed,) * 5,
        no_handshake_rounds_us=(69.0,) * 5,
        counted_full=770,
        counted_resumed=770,
        client_resumed=770,
        idle_us_per_s=500.0,
        others_share=others,
        server_cpu=1,
        client_cpu=0,
    )


def test_the_handshake_benchmark_answers_full_against_resumed_in_the_findings_and_the_report() -> None:
    cases = (_handshake_case("rest_aiohttp", 600, 558), _handshake_case("grpc_grpclib", 791, 713, others=0.2))
    groups = group_results(parse_results(_churn_run()))
    found = [f for f in findings.for_run(groups, "churn", handshake_cases=cases) if f.question == "churn"]
    [aiohttp] = [f for f in found if f.sentence.startswith("rest_aiohttp, handshake benchmark")]
    assert aiohttp.sentence.startswith(
        "rest_aiohttp, handshake benchmark: a resumed TLSv1.3 handshake costs 558 µs [513, 603] of the "
        "server's CPU, a full one 600 µs [560, 640]: 0.93x [0.86, 1.00]"
    )
    assert aiohttp.answer and not aiohttp.caveat
    [grpclib] = [f for f in found if f.sentence.startswith("grpc_grpclib")]
    assert grpclib.caveat == "others used 20% of the host"
    # The report's table, with or without churn in the run.
    report = SimpleNamespace(run=SimpleNamespace(groups=[]), handshakes=cases)
    assert connections_section.applies(report)
    [table] = [b for b in connections_section.blocks(report) if isinstance(b, Table)]
    assert [row[:5] for row in table.rows] == [
        ("rest_aiohttp", "TLSv1.3", "600 [560, 640]", "558 [513, 603]", "0.93 [0.86, 1.00]"),
        ("grpc_grpclib", "TLSv1.3", "791 [751, 831]", "713 [668, 758]", "0.90 [0.83, 0.97]"),
    ]
