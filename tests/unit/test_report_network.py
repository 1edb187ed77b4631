"""Unit tests: the report's network section (protocols within a profile, links against loopback)."""

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report import network as net
from labrunner.report.build import write_report
from labrunner.report.compare import group_results
from labrunner.report.document import Heading, Table, to_markdown
from labrunner.report.payload import SCHEMA as PAYLOAD_SCHEMA
from labrunner.report.payload import PayloadRow
from labrunner.report.sections import network as network_section
from labrunner.results.result import parse_results
from labrunner.results.store import RESULT_SCHEMA, result_path

from tests.support import ROOT, latency_from_p50, ok_result

TARGETS = ("quart-h1-tls", "quart-h2-tls", "grpc-tls")
BYTES = {"quart-h1-tls": 18500, "quart-h2-tls": 18400, "grpc-tls": 7700}
# Requests/s on loopback and on wan (closed model, 10 VUs): wan is latency-bound for all three.
RPS = {
    ("loopback", "quart-h1-tls"): 330.0,
    ("loopback", "quart-h2-tls"): 210.0,
    ("loopback", "grpc-tls"): 650.0,
    ("wan", "quart-h1-tls"): 128.0,
    ("wan", "quart-h2-tls"): 126.0,
    ("wan", "grpc-tls"): 149.0,
}
P50 = {"loopback": 20.0, "wan": 70.0}


def _scenarios(networks: tuple[str, ...], models: tuple[str, ...], repeats: int) -> tuple[Scenario, ...]:
    overrides = Overrides(targets=TARGETS, networks=networks, load_models=models, repeats=repeats)
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "network", overrides).scenarios


def _result(scenario: Scenario, jitter: float = 1.0) -> dict[str, Any]:
    network, target = scenario.network.name, scenario.target.name
    model = scenario.load_model
    rate = float(model.rate or 0)
    if model.rate:  # open: loopback serves the offered rate; wan serves it too, later
        rps, dropped = rate * jitter, 0
        if network == "wan" and target == "quart-h2-tls":
            rps, dropped = rate * 0.9 * jitter, int(rate * 0.1 * 6)
    else:
        rps, dropped = RPS[(network, target)] * jitter, 0
    requests = int(rps * 6)
    result = ok_result(
        scenario,
        requests=requests,
        rps=rps,
        latency_ms=latency_from_p50(P50[network] * jitter),
        received_bytes=requests * BYTES[target],
        window_s=6.0,
        cpu_seconds=2.0,
        quota_used=0.9,
        error_rate=0.0,
        dropped_iterations=dropped,
    )
    result["network"] = {"profile": network}
    if network != "loopback":
        result["network"] |= {"emulator": "userspace", "measured_rtt_s": 0.0502, "relay_cpu_s": 0.31}
    return result


def _results(repeats: int = 1, models: tuple[str, ...] = ("closed", "open")) -> list[dict[str, Any]]:
    jitter = {1: 1.0, 2: 1.03, 3: 0.97}
    return [_result(s, jitter[s.repeat]) for s in _scenarios(("loopback", "wan"), models, repeats)]


def _pairs(comparisons: list[Any]) -> set[tuple[str, str, str, str]]:
    return {(c.candidate.network, c.kind, c.candidate.target, c.baseline.target) for c in comparisons}


def test_the_network_preset_runs_the_closed_and_the_open_model() -> None:
    scenarios = expand(load_matrix(ROOT / "matrix.toml"), "local", "network").scenarios
    models = {s.load_model.name for s in scenarios}
    assert models == {"closed", "open"}
    (rate,) = {s.load_model.rate for s in scenarios if s.load_model.name == "open"}
    # Below what the slowest target (quart-h2-tls, ~200 req/s at 0.5 CPU) serves on loopback, and
    # below what 10 closed VUs reach over 50 ms: the open model then isolates the link's latency.
    assert rate is not None and 0 < rate <= 150


def test_one_network_profile_has_no_network_section() -> None:
    results = [r for r in _results() if r["network"]["profile"] == "loopback"]
    assert net.networks(group_results(parse_results(results))) == ["loopback"]


def test_protocols_compare_within_each_network_profile_never_across() -> None:
    pairs = _pairs(net.within_profile(group_results(parse_results(_results(models=("closed",))))))
    for network in ("loopback", "wan"):
        assert (network, "HTTP/2 vs HTTP/1.1", "quart-h2-tls", "quart-h1-tls") in pairs
        assert (network, "gRPC vs REST", "grpc-tls", "quart-h1-tls") in pairs
        assert (network, "gRPC vs REST", "grpc-tls", "quart-h2-tls") in pairs
    comparisons = net.within_profile(group_results(parse_results(_results(models=("closed",)))))
    assert all(c.candidate.network == c.baseline.network for c in comparisons)
    assert len(comparisons) == 6


def test_with_repeats_the_comparisons_carry_intervals() -> None:
    groups = group_results(parse_results(_results(repeats=3, models=("closed",))))
    (wan_h2,) = [
        c
        for c in net.within_profile(groups)
        if c.candidate.network == "wan" and c.candidate.target == "quart-h2-tls"
    ]
    r = wan_h2.ratios["rps"]
    assert r.significant is not None and r.low is not None and r.high is not None
    assert r.low < 126 / 128 < r.high
    (cost,) = [c for c in net.link_costs(groups) if c.group.target == "grpc-tls"]
    assert cost.rps is not None and cost.rps.significant is True  # 149 vs 650 req/s: no doubt
    assert cost.rps.estimate == pytest.approx(149 / 650)
    blocks = network_section.section(groups)
    text = to_markdown(blocks, Path("."))
    assert "significant" in text and "n/a: one repeat" not in text


def test_a_link_costs_each_target_against_itself_on_loopback() -> None:
    groups = group_results(parse_results(_results(models=("closed",))))
    costs = {c.group.target: c for c in net.link_costs(groups)}
    assert set(costs) == set(TARGETS)
    for target, cost in costs.items():
        assert cost.group.network == "wan" and cost.loopback.network == "loopback"
        assert cost.loopback.target == target and cost.kind == net.CLOSED
        assert cost.rps is not None and cost.rps.estimate == pytest.approx(
            RPS["wan", target] / RPS["loopback", target]
        )
        assert cost.rps.note == "n/a: one repeat"
        assert cost.p50_added_ms == pytest.approx(50.0)
        assert cost.p99_added_ms == pytest.approx(100.0)
    assert net.measured_rtt_ms(costs["grpc-tls"].group) == pytest.approx(50.2)
    assert net.relay_cpu_s(costs["grpc-tls"].group) == pytest.approx(0.31)
    assert net.relay_cpu_s(costs["grpc-tls"].loopback) is None


def test_the_open_model_shows_offered_and_achieved_rate_and_dropped_iterations() -> None:
    groups = group_results(parse_results(_results()))
    open_wan = {g.target: g for g in groups if net.load_kind(g) == net.OPEN and g.network == "wan"}
    h2 = open_wan["quart-h2-tls"]
    rate = net.offered_rate(h2)
    assert rate is not None
    assert net.achieved_share(h2) == pytest.approx(0.9)
    assert net.dropped(h2) == int(rate * 0.1 * 6)
    assert net.offered_rate(next(g for g in groups if net.load_kind(g) == net.CLOSED)) is None
    open_costs = [c for c in net.link_costs(groups) if c.kind == net.OPEN]
    closed_costs = [c for c in net.link_costs(groups) if c.kind == net.CLOSED]
    assert len(open_costs) == len(closed_costs) == 3  # the two models are never mixed
    assert all(c.loopback.load_model == c.group.load_model for c in open_costs + closed_costs)
    (grpc,) = [c for c in open_costs if c.group.target == "grpc-tls"]
    assert grpc.rps is not None and grpc.rps.estimate == pytest.approx(1.0)  # the rate is kept
    assert grpc.p50_added_ms == pytest.approx(50.0)  # the link shows as latency


def test_the_section_has_a_closed_and_an_open_part_with_their_tables() -> None:
    blocks = network_section.section(group_results(parse_results(_results())))
    headings = [b.text for b in blocks if isinstance(b, Heading)]
    assert headings == ["Network profiles", "Closed model", "Open model"]
    tables = [b for b in blocks if isinstance(b, Table)]
    open_overview = next(t for t in tables if "offered req/s" in t.headers and "dropped" in t.headers)
    h2_wan = next(r for r in open_overview.rows if r[0] == "`wan`" and r[2] == "quart-h2-tls")
    assert h2_wan[open_overview.headers.index("profile")] == "small"
    assert h2_wan[open_overview.headers.index("achieved / offered")] == "90%"
    assert h2_wan[open_overview.headers.index("relay CPU s")] == "0.31"
    assert h2_wan[open_overview.headers.index("RTT measured ms")] == "50.20"
    costs = next(
        t for t in tables if "req/s loopback → here" in t.headers and "offered req/s" not in t.headers
    )
    grpc = next(r for r in costs.rows if r[1] == "grpc-tls")
    assert grpc[2] == "650.0 → 149.0" and grpc[costs.headers.index("p50 added ms")] == "+50.00"
    assert grpc[costs.headers.index("bytes / resp loopback → here")] == "7700 → 7700"
    text = to_markdown(blocks, Path("."))
    assert "`wan` against loopback: quart-h1-tls (HTTP/1.1 TLS) 0.39x req/s, +50.0 ms p50" in text
    assert "grpc-tls (gRPC TLS)" in text


def test_the_report_holds_the_network_section(tmp_path: Path) -> None:
    for result in _results():
        write_json_atomic(result_path(tmp_path, result["scenario_id"]), {"schema": RESULT_SCHEMA, **result})
    write_json_atomic(tmp_path / "manifest.json", {"run_id": "net", "git": {"sha": "abc"}, "host": {}})
    row = PayloadRow(100, 20000, 4000, 15000, 3800)
    write_json_atomic(tmp_path / "payload.json", {"schema": PAYLOAD_SCHEMA, "rows": [asdict(row)]})
    md, page = write_report(tmp_path)
    text = md.read_text()
    assert "## Network profiles" in text and "### Open model" in text and "### Closed model" in text
    assert "Network profiles" in page.read_text()


def test_link_bound_groups_are_compared_within_their_profile_and_marked() -> None:
    # Over wan the services idle between round trips: a lower bound of the service's throughput,
    # which the report's own comparisons leave out, but over a link it is the measurement.
    results = _results(models=("closed",))
    for r in results:
        if r["network"]["profile"] == "wan":
            r["service"]["usage"]["cpu_utilisation"] = 0.3
    groups = group_results(parse_results(results))
    assert all(g.lower_bound for g in groups if g.network == "wan")
    wan = [c for c in net.within_profile(groups) if c.candidate.network == "wan"]
    assert {(c.kind, c.candidate.target, c.baseline.target) for c in wan} == {
        ("HTTP/2 vs HTTP/1.1", "quart-h2-tls", "quart-h1-tls"),
        ("gRPC vs REST", "grpc-tls", "quart-h1-tls"),
        ("gRPC vs REST", "grpc-tls", "quart-h2-tls"),
    }
    (h2,) = [c for c in wan if c.kind == "HTTP/2 vs HTTP/1.1"]
    assert h2.ratios["rps"].estimate == pytest.approx(126 / 128)
    assert h2.ratios["bytes"].estimate == pytest.approx(18400 / 18500)
    table = next(b for b in network_section.section(groups) if isinstance(b, Table) and "note" in b.headers)
    row = next(r for r in table.rows if r[0] == "`wan`" and r[2] == "HTTP/2 vs HTTP/1.1")
    assert row[-1].startswith("quart-h2-tls, quart-h1-tls: paced by the link")
    loopback_row = next(r for r in table.rows if r[0] == "`loopback`")
    assert loopback_row[-1] == ""
