"""Unit tests: the connection model (connections x streams) as an axis of the matrix: what it plans and
refuses, the ids, k6's env, the duets across connection models, the results and the findings, and the
count of a service's connections from the kernel's tables."""

import copy
import socket
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ScenarioFailed, ServiceHandle
from labrunner.backends.connections import TABLES, established
from labrunner.model import duet
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import Overrides, Plan, Scenario
from labrunner.model.schema import MatrixError
from labrunner.report import findings
from labrunner.report.compare import compare_groups, group_results
from labrunner.report.sections.findings import forest_rows
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict
from labrunner.run import connections
from labrunner.run.k6.invocation import K6Setup

from tests.support import ROOT, ok_result

MATRIX = ROOT / "matrix.toml"
MULTIPLEXED = Overrides(targets=("quart-h1-tls", "quart-h2-tls", "grpc-tls"), streams=(1, 10))


def _plan(overrides: Overrides = MULTIPLEXED, preset: str = "ci") -> Plan:
    return expand(load_matrix(MATRIX), "local", preset, overrides)


def test_streams_split_a_closed_models_vus_into_connections_on_the_protocols_that_multiplex() -> None:
    plan = _plan()
    assert [(s.target.name, s.connection_model) for s in plan.scenarios] == [
        ("quart-h1-tls", "10x1"),
        ("quart-h2-tls", "10x1"),
        ("grpc-tls", "10x1"),
        ("quart-h2-tls", "1x10"),
        ("grpc-tls", "1x10"),
    ]
    # One stream keeps the ids runs made before connection models had; more say the model.
    assert [s.group for s in plan.scenarios if s.target.name == "grpc-tls"] == [
        "grpc-tls.small.c100.closed",
        "grpc-tls.small.c100.closed.1x10",
    ]
    assert [s.connections for s in plan.scenarios[-2:]] == [1, 1]
    # HTTP/1.1 is said to be unable, not faked.
    assert plan.notes == (
        "HTTP/1.1 cannot multiplex: quart-h1-tls run at 1 stream per connection only (their comparable "
        "is as many connections)",
    )
    assert [scenario_dict(s)["streams"] for s in plan.scenarios] == [1, 1, 1, 10, 10]


def test_streams_above_a_models_vus_or_under_an_open_model_are_not_planned_and_said_so() -> None:
    plan = _plan(Overrides(targets=("grpc",), load_models=("closed", "closed-100", "open"), streams=(1, 100)))
    assert sorted({(s.load_model.name, s.connection_model) for s in plan.scenarios}) == [
        ("closed", "10x1"),
        ("closed-100", "100x1"),
        ("closed-100", "1x100"),
        ("open", "?x1"),
    ]
    assert plan.notes == (
        "streams above 1 run under closed load models only, not open",
        "closed has 10 VUs: not run at 100 streams",
    )


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (Overrides(targets=("aiohttp-h1",), streams=(5,)), r"streams \[5\]: HTTP/1.1 cannot multiplex"),
        (Overrides(targets=("grpc",), streams=(3,)), r"streams 3 does not divide the 10 VUs of load model"),
        (Overrides(targets=("grpc",), streams=(0,)), r"streams\[0\]: 0 must be a positive integer"),
        (
            Overrides(targets=("grpc",), streams=(200,), vus=200),
            r"200 exceeds the 100 concurrent streams a lab server allows",
        ),
        (
            Overrides(targets=("grpc",), load_models=("open",), streams=(2,)),
            r"streams need a closed \(constant-vus\) load model",
        ),
    ],
)
def test_a_connection_model_nothing_can_run_is_refused_with_the_reason(
    overrides: Overrides, refusal: str
) -> None:
    with pytest.raises(MatrixError, match=refusal):
        _plan(overrides)


def test_the_file_refuses_streams_that_are_not_positive_integers_and_callers_refuse_any() -> None:
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["presets"]["ci"]["streams"] = [1, "two"]
    with pytest.raises(MatrixError, match=r"streams\[1\]"):
        parse_matrix(data, MATRIX)
    data["presets"]["ci"]["streams"] = [10]
    data["presets"]["ci"]["measure"] = "caller"
    with pytest.raises(MatrixError, match="the callers hold one call per connection"):
        parse_matrix(data, MATRIX)


def _handle() -> ServiceHandle:
    address = Endpoint("127.0.0.1", 8443)
    return ServiceHandle("s", "grpc_aio", address, address, None, None, 1, "cgroup-v1", (1,), (0,))


@pytest.mark.parametrize(("streams", "vus", "env_streams"), [(1, "10", None), (10, "1", "10")])
def test_k6_runs_the_connections_as_vus_each_sending_its_streams_at_once(
    tmp_path: Path, streams: int, vus: str, env_streams: str | None
) -> None:
    [scenario] = [s for s in _plan().scenarios if s.target.name == "grpc-tls" and s.streams == streams]
    setup = K6Setup(scenario, _handle(), "r1", ROOT, tmp_path / "ca.pem", tmp_path, tmp_path / "k6.log", None)
    for invocation in (setup.warmup(), setup.window()):
        assert (invocation.env["VUS"], invocation.env.get("STREAMS")) == (vus, env_streams)
        args = list(invocation.args)
        assert f"connections={scenario.connection_model}" in args


def test_the_multiplexing_preset_duets_across_connection_models_with_unique_ids() -> None:
    plan = duet.plan_duets(_plan(Overrides(), preset="multiplexing"), duet.AUTO)
    ids = [s.id for s in plan.scenarios]
    assert len(ids) == len(set(ids))
    groups = {s.group for s in plan.scenarios}
    assert {
        "quart-h2-tls.quarter.c100.closed.1x10.vs-quart-h2-tls",
        "quart-h2-tls.quarter.c100.closed.vs-quart-h2-tls-1x10",
        "quart-h2-tls.quarter.c100.closed.1x10.vs-quart-h1-tls",
        "quart-h1-tls.quarter.c100.closed.vs-quart-h2-tls-1x10",
        "grpc-tls.quarter.c100.closed-100.1x100.vs-quart-h2-tls-1x100",
    } <= groups
    # Every block is its two sides, each naming the other, at one repeat.
    for unit in plan.run_units:
        a, b = unit
        assert a.duet and b.duet and a.repeat == b.repeat
        assert (a.duet.partner, b.duet.partner) == (b.duet_name, a.duet_name)


def _result(scenario: Scenario, rps: float) -> dict[str, Any]:
    """A 5 s window at `rps`, its service at its whole quota for 1 CPU second."""
    return ok_result(
        scenario,
        requests=int(rps * 5),
        rps=rps,
        latency_ms={},
        received_bytes=int(rps * 5 * 1000),
        window_s=5.0,
        cpu_seconds=1.0,
        quota_used=1.0,
    )


# The host's speed in each block: both sides of a block share it.
HOST = {1: 1.0, 2: 0.8, 3: 1.2}


def test_the_findings_answer_multiplexing_by_connection_model() -> None:
    """quart-h2-tls on 1 connection serves 1.5x its 10 connections, and 1.2x HTTP/1.1's 10."""
    plan = duet.plan_duets(
        _plan(Overrides(targets=("quart-h1-tls", "quart-h2-tls"), streams=(1, 10)), "multiplexing"), duet.AUTO
    )
    speed = {("quart-h1-tls", 1): 1000.0, ("quart-h2-tls", 1): 800.0, ("quart-h2-tls", 10): 1200.0}
    results = [_result(s, speed[(s.target.name, s.streams)] * HOST[s.repeat]) for s in plan.scenarios]
    comparisons = compare_groups(group_results(parse_results(results)))
    ratios = {
        (c.kind, c.candidate.connection_model, c.baseline.connection_model): round(
            c.ratios["rps"].estimate, 3
        )
        for c in comparisons
    }
    assert ratios[("multiplexed vs connections", "1x10", "10x1")] == 1.5
    assert ratios[("HTTP/2 multiplexed vs HTTP/1.1", "1x10", "10x1")] == 1.2
    lines = [f.sentence for f in findings.for_run(group_results(parse_results(results)), "multiplexing")]
    assert any(line.startswith("quart-h2-tls (1x10) vs quart-h2-tls (10x1): req/s 1.50x") for line in lines)
    assert any(line.startswith("quart-h2-tls (1x10) vs quart-h1-tls (10x1): req/s 1.20x") for line in lines)
    # The report's forest tells every row apart: the connection models, and the load models they ran in.
    labels = [label for label, _ in forest_rows(group_results(parse_results(results)))]
    assert len(labels) == len(set(labels))
    assert "quart-h2-tls (1x10) / quart-h2-tls (10x1) (closed)" in labels
    assert "quart-h2-tls (10x10) / quart-h1-tls (100x1) (closed-100)" in labels


def test_results_written_before_connection_models_ran_one_stream_a_connection() -> None:
    [scenario] = [s for s in _plan().scenarios if s.target.name == "grpc-tls" and s.streams == 1]
    old = _result(scenario, 100.0)
    del old["scenario"]["streams"]
    [result] = parse_results([old])
    assert (result.scenario.streams, result.scenario.connection_model) == (1, "10x1")


def test_established_counts_the_servers_side_of_its_connections_only() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [server.accept()[0] for _ in clients]
        tables = "".join(Path(table).read_text() for table in TABLES)
        # The clients' ends, whose remote port is the server's, are not counted.
        assert established(tables, port) == 3
        for sock in clients[:2] + accepted[:2]:
            sock.close()
        tables = "".join(Path(table).read_text() for table in TABLES)
        assert established(tables, port) == 1
        for sock in clients[2:] + accepted[2:]:
            sock.close()
    # A read while sockets come and go may list a row twice: one connection still.
    row = "   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0\n"
    assert established(row + row.replace("   1:", "   2:"), 0x1F90) == 1
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    listening = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
    assert established(header + listening, 0x1F90) == 0


def test_the_watch_counts_on_after_its_moments_until_it_sees_the_plan() -> None:
    """A connection late past the last moment (a SYN lost on a lossy link, a slow driver's start) is
    counted when it comes; once the plan is seen, or without a plan, counting stops at the moments."""
    counted, seen = iter([6, 7, 8, 8, 10, 99]), threading.Event()

    def count() -> int:
        found = next(counted)
        if found == 10:
            seen.set()
        return found

    with connections.Watch(count, 0.05, planned=10) as watch:
        assert seen.wait(10)
        time.sleep(0.05)  # a count after the plan was seen would take the 99
    assert (watch.counts, watch.peak) == ([6, 7, 8, 8, 10], 10)
    unplanned, ended = iter([1, 2, 3, 4]), threading.Event()

    def count_unplanned() -> int:
        found = next(unplanned)
        if found == 3:
            ended.set()
        return found

    with connections.Watch(count_unplanned, 0.05) as without_plan:
        assert ended.wait(10)
        time.sleep(0.05)
    assert without_plan.counts == [1, 2, 3]


def test_the_watch_counts_during_the_run_and_the_check_holds_the_plan() -> None:
    counted, last = iter([3, 5, 4]), threading.Event()

    def count() -> int:
        found = next(counted)
        if found == 4:  # the third moment: the run may end
            last.set()
        return found

    with connections.Watch(count, 0.05) as watch:
        assert last.wait(10)
    assert (watch.counts, watch.peak) == ([3, 5, 4], 5)
    # A run that ends before its first moment is counted nowhere.
    with connections.Watch(count, 60) as early:
        pass
    assert (early.counts, early.peak) == ([], None)
    connections.check(5, 5, "measured window", "5x2")
    connections.check(5, 3, "warmup", "5x2")  # the warm-up's first count may precede some VUs
    connections.check(None, 7, "measured window", "?x1")  # an open model's connections vary
    with pytest.raises(
        ScenarioFailed, match=r"held 10 connections from k6 in the warmup; the plan is 1 \(1x10"
    ):
        connections.check(1, 10, "warmup", "1x10")
    with pytest.raises(ScenarioFailed, match="held 3 connections from k6 in the measured window"):
        connections.check(5, 3, "measured window", "5x2")


@pytest.mark.parametrize(
    ("counts", "planned", "held"),
    [
        ([10, 11, 10], 10, 10),  # one count caught a re-dialed connection beside its replacement
        ([11, 11, 10], 10, 11),  # two counts saw it: held, and the check fails
        ([10, 10, 10, 20], 1, 10),  # a VU that does not multiplex: held at every count but the last
        ([20, 20, 20], 1, 20),
        ([6, 7, 10], 10, 10),  # late to come, then all held: the most counted
        ([11], 10, 11),  # one count alone tells nothing apart
        ([4, 9, 5], None, 9),  # no plan: the most counted
        ([], 10, None),
    ],
)
def test_the_connections_held_are_the_most_counted_unless_one_count_alone_saw_more_than_planned(
    counts: list[int], planned: int | None, held: int | None
) -> None:
    watch = connections.Watch(lambda: None, 60, planned)
    watch.counts = counts
    assert watch.held == held
