"""Unit tests: the network findings (what a link costs each protocol, where their order flips)."""

import math
import re
from collections.abc import Mapping
from typing import Any

import pytest
from labrunner.model.matrix import Overrides, Scenario, expand, load_matrix
from labrunner.report.compare import group_results
from labrunner.report.findings import network as nf
from labrunner.report.findings.finding import Evidence
from labrunner.results.result import parse_results

from tests.support import ROOT, latency_from_p50, ok_result

TARGETS = ("aiohttp-h1-tls", "quart-h2-tls", "grpc-tls")
# Closed model, 10 VUs: on loopback aiohttp leads gRPC; over wan every target waits on the link and
# gRPC's smaller responses lead.
RPS = {
    ("loopback", "aiohttp-h1-tls"): 1400.0,
    ("loopback", "quart-h2-tls"): 210.0,
    ("loopback", "grpc-tls"): 650.0,
    ("wan", "aiohttp-h1-tls"): 120.0,
    ("wan", "quart-h2-tls"): 110.0,
    ("wan", "grpc-tls"): 149.0,
}
# p50 in ms under either model: on loopback aiohttp answers first, over wan gRPC does.
P50 = {
    ("loopback", "aiohttp-h1-tls"): 5.0,
    ("loopback", "quart-h2-tls"): 20.0,
    ("loopback", "grpc-tls"): 8.0,
    ("wan", "aiohttp-h1-tls"): 58.0,
    ("wan", "quart-h2-tls"): 75.0,
    ("wan", "grpc-tls"): 55.0,
}
JITTER = (1.0, 1.02, 0.98)


def _scenarios() -> tuple[Scenario, ...]:
    overrides = Overrides(targets=TARGETS, networks=("loopback", "wan"), repeats=3)
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "network", overrides).scenarios


def _result(scenario: Scenario, rps: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    key = (scenario.network.name, scenario.target.name)
    jitter = JITTER[scenario.repeat - 1]
    rate = scenario.load_model.rate
    achieved = rate * jitter if rate else rps[key] * jitter
    requests = int(achieved * 10)
    return ok_result(
        scenario,
        requests=requests,
        rps=achieved,
        latency_ms=latency_from_p50(P50[key] * jitter),
        received_bytes=requests * 10_000,
        window_s=10.0,
        cpu_seconds=4.0,
        quota_used=0.9,
        dropped_iterations=0,
    ) | {"network": {"profile": scenario.network.name}}


def _findings(
    rps: Mapping[tuple[str, str], float] = RPS, networks: tuple[str, ...] = ("loopback", "wan")
) -> list[Any]:
    results = [_result(s, rps) for s in _scenarios() if s.network.name in networks]
    return nf.findings(Evidence(tuple(group_results(parse_results(results)))))


def test_one_network_profile_has_no_network_findings() -> None:
    assert _findings(networks=("loopback",)) == []


def test_what_the_link_costs_each_protocol_under_the_closed_model() -> None:
    (closed,) = [f for f in _findings() if f.sentence.startswith("`wan` against loopback, closed model")]
    assert closed.question == "network"
    assert "(10 VUs)" in closed.sentence
    # req/s here / on loopback with its interval, and the p50 the link added (medians over repeats).
    aiohttp = re.search(
        r"aiohttp-h1-tls ([\d.]+)x req/s \[([\d.]+), ([\d.]+)\], p50 \+([\d.]+) ms", closed.sentence
    )
    assert aiohttp is not None
    estimate, low, high, added = map(float, aiohttp.groups())
    assert estimate == pytest.approx(120 / 1400, abs=0.005)
    assert 0 < low <= estimate <= high
    assert added == pytest.approx(58 - 5, abs=0.05)
    assert closed.sentence.endswith("small profile, 100 records, build")
    assert closed.effect == pytest.approx(math.log(1400 / 120), rel=0.02)


def test_what_the_link_costs_under_the_open_model_is_latency_at_the_offered_rate() -> None:
    (opened,) = [f for f in _findings() if f.sentence.startswith("`wan` against loopback, open model")]
    assert "100/s offered" in opened.sentence
    assert "grpc-tls p50 +47.0 ms, 100% of the offered rate" in opened.sentence
    assert opened.effect == pytest.approx(math.log(58 / 5), rel=0.02)


def test_an_order_that_flips_over_a_link_is_named_with_both_leads() -> None:
    flips = [f for f in _findings() if f.sentence.startswith("over `wan`")]
    closed = next(f for f in flips if "(closed model)" in f.sentence)
    assert re.search(r"grpc-tls leads aiohttp-h1-tls 1\.2\dx \[[\d.]+, [\d.]+\] in req/s", closed.sentence)
    assert re.search(r"on loopback aiohttp-h1-tls leads 2\.1\dx \[[\d.]+, [\d.]+\]", closed.sentence)
    opened = next(f for f in flips if "(open model)" in f.sentence)
    assert "grpc-tls leads aiohttp-h1-tls" in opened.sentence and "in p50 (lower latency)" in opened.sentence
    # grpc-tls against quart-h2-tls leads on both: no flip to report.
    assert not any("quart-h2-tls" in f.sentence for f in flips)


def test_without_a_flip_the_findings_say_the_order_holds() -> None:
    grpc_ahead = dict(RPS) | {("loopback", "aiohttp-h1-tls"): 600.0, ("wan", "aiohttp-h1-tls"): 100.0}
    found = _findings(grpc_ahead)
    same = [f for f in found if f.sentence.startswith("closed model: over every link")]
    assert len(same) == 1 and "same order as on loopback (2 protocol pairs compared)" in same[0].sentence
    assert not any(f.sentence.startswith("over `wan` (closed model)") for f in found)
