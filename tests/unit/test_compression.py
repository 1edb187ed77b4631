"""Unit tests: compression as an axis of the matrix (what it plans and refuses, the ids, the service's
and k6's env, the findings' bytes and CPU), and the REST servers' response encoding."""

import copy
import gzip
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ScenarioFailed, ServiceHandle, check_listening, service_env
from labrunner.model import duet
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import Overrides, Plan, Scenario
from labrunner.model.schema import MatrixError
from labrunner.report import findings
from labrunner.report.compare import group_results
from labrunner.report.document import Table
from labrunner.report.sections import connections as connections_section
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict
from labrunner.run.k6.invocation import K6Setup

from services.common.rest import ResponseEncoding, accepts_gzip
from tests.support import ROOT, ok_result

MATRIX = ROOT / "matrix.toml"
COMPRESSED = Overrides(targets=("aiohttp-h1", "grpc"), compressions=("identity", "gzip"))


def _plan(overrides: Overrides = COMPRESSED, preset: str = "ci") -> Plan:
    return expand(load_matrix(MATRIX), "local", preset, overrides)


def test_compression_is_an_axis_whose_identity_keeps_the_ids_runs_had_before() -> None:
    plan = _plan()
    assert [(s.target.name, s.compression) for s in plan.scenarios] == [
        ("aiohttp-h1", "identity"),
        ("grpc", "identity"),
        ("aiohttp-h1", "gzip"),
        ("grpc", "gzip"),
    ]
    assert [s.group for s in plan.scenarios if s.target.name == "grpc"] == [
        "grpc.small.c100.closed",
        "grpc.small.c100.closed.gzip",
    ]
    assert [scenario_dict(s)["compression"] for s in plan.scenarios] == [
        "identity",
        "identity",
        "gzip",
        "gzip",
    ]


def test_compression_runs_downloads_only_and_says_so() -> None:
    plan = _plan(
        Overrides(targets=("grpc",), compressions=("identity", "gzip"), directions=("download", "upload"))
    )
    assert sorted((s.direction, s.compression) for s in plan.scenarios) == [
        ("download", "gzip"),
        ("download", "identity"),
        ("upload", "identity"),
    ]
    assert plan.notes == ("compression gzip runs downloads only (k6 compresses no request)",)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            Overrides(targets=("grpc",), compressions=("br",)),
            r"'br': the lab's servers compress with 'identity' or 'gzip' only",
        ),
        (
            Overrides(targets=("grpc", "grpclib"), compressions=("gzip",)),
            r"compression gzip: grpclib cannot compress its responses \(those that can: rest_aiohttp",
        ),
        (
            Overrides(targets=("floor-aiohttp-h1",), compressions=("gzip",)),
            r"floor-aiohttp-h1 cannot compress",
        ),
    ],
)
def test_a_compression_a_server_cannot_do_is_refused(overrides: Overrides, refusal: str) -> None:
    preset = "floor" if overrides.targets == ("floor-aiohttp-h1",) else "ci"
    with pytest.raises(MatrixError, match=refusal):
        _plan(overrides, preset)


def test_callers_refuse_compression() -> None:
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["presets"]["ci"]["compressions"] = ["gzip"]
    data["presets"]["ci"]["measure"] = "caller"
    with pytest.raises(MatrixError, match="compression gzip: the callers measure identity only"):
        parse_matrix(data, MATRIX)


def _handle() -> ServiceHandle:
    address = Endpoint("127.0.0.1", 8081)
    return ServiceHandle("s", "rest_aiohttp", address, address, None, None, 1, "cgroup-v1", (1,), (0,))


@pytest.mark.parametrize(("compression", "env"), [("identity", None), ("gzip", "gzip")])
def test_the_service_compresses_and_k6_accepts_it(tmp_path: Path, compression: str, env: str | None) -> None:
    [scenario] = [
        s for s in _plan().scenarios if s.target.name == "aiohttp-h1" and s.compression == compression
    ]
    assert service_env(scenario)["COMPRESSION"] == compression
    setup = K6Setup(scenario, _handle(), "r1", ROOT, tmp_path / "ca.pem", tmp_path, tmp_path / "k6.log", None)
    for invocation in (setup.warmup(), setup.window()):
        assert invocation.env.get("COMPRESSION") == env
        assert f"compression={compression}" in list(invocation.args)
    # The service must say it compresses as planned; a line without it (a server before compression) did not.
    listening = {"port": 8081, "tls": False, "response_model": "build", "shape": "cars"}
    if compression == "identity":
        check_listening(listening, scenario, "")
    else:
        with pytest.raises(ScenarioFailed, match="compression=gzip"):
            check_listening(listening, scenario, "")
        check_listening({**listening, "compression": "gzip"}, scenario, "")


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("br, gzip;q=0.5", True),
        ("GZIP", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("identity", False),
        ("gzipped", False),
        (None, False),
        ("gzip;q=nonsense", False),
        ("*, gzip;q=0", False),  # * stands for the codings not listed
        ("deflate, *;q=0.5, gzip;q=0", False),
        ("gzip;q=0, *", False),
        ("br, *;q=0.1", True),
        ("x-gzip", True),
    ],
)
def test_gzip_is_accepted_as_rfc_9110_says(header: str | None, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted


def test_the_rest_servers_gzip_the_body_only_when_they_compress_and_the_client_accepts() -> None:
    body = b'{"records": [' + b'{"make": "Volvo", "year": 2020},' * 50 + b"{}]}"
    assert ResponseEncoding("identity").encode(body, "gzip") == (body, None)
    assert ResponseEncoding("gzip").encode(body, None) == (body, {"Vary": "Accept-Encoding"})
    sent, headers = ResponseEncoding("gzip").encode(body, "gzip, br")
    assert headers == {"Vary": "Accept-Encoding", "Content-Encoding": "gzip"}
    assert gzip.decompress(sent) == body and len(sent) < len(body) / 5


# Bytes a response and CPU per response by target and compression; req/s follows from the CPU.
BYTES = {("aiohttp-h1", "identity"): 18_500, ("aiohttp-h1", "gzip"): 3_850, ("grpc", "identity"): 7_600}
BYTES[("grpc", "gzip")] = 3_900
CPU_MS = {("aiohttp-h1", "identity"): 0.20, ("aiohttp-h1", "gzip"): 0.30, ("grpc", "identity"): 0.60}
CPU_MS[("grpc", "gzip")] = 0.66
HOST = {1: 1.0, 2: 0.9, 3: 1.1}


def _result(scenario: Scenario) -> dict[str, Any]:
    key = (scenario.target.name, scenario.compression)
    calls = int(1000 / CPU_MS[key] * HOST[scenario.repeat])
    return ok_result(
        scenario,
        requests=calls,
        rps=calls / 5,
        latency_ms={},
        received_bytes=calls * BYTES[key],
        window_s=5.0,
        cpu_seconds=1.0 * HOST[scenario.repeat],
        # Over the narrow link the link sets the pace: the service idles, its req/s a lower bound.
        quota_used=1.0 if scenario.network.name == "loopback" else 0.3,
    )


def test_the_findings_say_what_gzip_saves_on_the_wire_and_costs_in_cpu() -> None:
    plan = duet.plan_duets(_plan(COMPRESSED, "compression"), duet.AUTO)
    groups = group_results(parse_results([_result(s) for s in plan.scenarios]))
    lines = [f.sentence for f in findings.for_run(groups, "compression") if f.question == "compression"]
    assert any(
        line.startswith(
            "aiohttp-h1, loopback: gzip 3,850 bytes a response against 18,500 (0.21x); "
            "server CPU/response 1.50x"
        )
        for line in lines
    ), lines
    assert any(
        line.startswith("grpc, loopback: gzip 3,900 bytes a response against 7,600 (0.51x)") for line in lines
    )
    assert all("; req/s 0." in line for line in lines if ", loopback:" in line)
    # Over the link, compared though no side used its quota: the link, not the service, sets the pace.
    narrow = [f for f in findings.for_run(groups, "compression") if ", narrow: " in f.sentence]
    assert {f.sentence.split(",")[0] for f in narrow} == {"aiohttp-h1", "grpc"}
    assert all(not f.caveat for f in narrow)
    assert all(f.held_fixed.endswith("no TLS, narrow") for f in narrow)
    # Nor is the link's pace said to keep the narrow groups out of every ratio.
    assert not [f for f in findings.for_run(groups, "compression") if "in no ratio" in f.sentence]
    assert any(
        f.sentence.startswith("grpc, narrow: gzip 3,900 bytes a response against 7,600") for f in narrow
    )


def test_results_written_before_compression_sent_responses_as_they_were() -> None:
    [scenario] = [s for s in _plan().scenarios if s.target.name == "grpc" and s.compression == "identity"]
    old = _result(scenario)
    del old["scenario"]["compression"]
    [result] = parse_results([old])
    assert result.scenario.compression == "identity"


def test_the_report_shows_bytes_and_cpu_with_and_without_compression() -> None:
    plan = duet.plan_duets(_plan(COMPRESSED, "compression"), duet.AUTO)
    groups = group_results(parse_results([_result(s) for s in plan.scenarios]))
    report = SimpleNamespace(run=SimpleNamespace(groups=groups), handshakes=())
    assert connections_section.applies(report)
    [compression] = [b for b in connections_section.blocks(report) if isinstance(b, Table)]
    rows = {(row[0], row[2]): row for row in compression.rows}
    assert set(rows) == {(t, c) for t in ("aiohttp-h1", "grpc") for c in ("identity", "gzip")}
    assert rows[("aiohttp-h1", "gzip")][5] == "3,850" and rows[("aiohttp-h1", "identity")][5] == "18,500"
    assert rows[("grpc", "gzip")][6] == "0.660"
