"""Unit tests: the call's direction as an axis of the matrix, the upload body, k6's upload env, and
the report comparing uploads only with uploads."""

import copy
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from labrunner.backends.base import Endpoint, ServiceHandle
from labrunner.cli import run_matrix as cli
from labrunner.model.matrix import expand, load_matrix, parse_matrix
from labrunner.model.scenario import Overrides
from labrunner.model.schema import MatrixError
from labrunner.report.compare import compare_groups, group_results
from labrunner.results.result import parse_results
from labrunner.results.store import scenario_dict
from labrunner.run.k6.invocation import K6Setup
from labrunner.run.uploads import upload_body

from services.common.pb import cars_pb2
from services.common.records import load_pool
from tests.support import ROOT

MATRIX = ROOT / "matrix.toml"
BOTH = Overrides(
    targets=("aiohttp-h1", "grpc"), response_models=("build", "prebuilt"), directions=("download", "upload")
)


def test_directions_multiply_and_an_upload_runs_under_the_first_response_model_only() -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", BOTH)
    assert [(s.target.name, s.response_model, s.direction) for s in plan.scenarios] == [
        ("aiohttp-h1", "build", "download"),
        ("grpc", "build", "download"),
        ("aiohttp-h1", "build", "upload"),
        ("grpc", "build", "upload"),
        ("aiohttp-h1", "prebuilt", "download"),
        ("grpc", "prebuilt", "download"),
    ]
    # A download keeps the group id runs made before directions existed; an upload says so.
    assert [s.group for s in plan.scenarios if s.target.name == "aiohttp-h1"] == [
        "aiohttp-h1.small.c100.closed",
        "aiohttp-h1.small.c100.closed.upload",
        "aiohttp-h1.small.c100.closed.prebuilt",
    ]
    assert [scenario_dict(s)["direction"] for s in plan.scenarios[:3]] == ["download", "download", "upload"]


def test_the_default_direction_is_download_and_a_wrong_one_is_named() -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc",)))
    assert {s.direction for s in plan.scenarios} == {"download"}
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["presets"]["ci"]["directions"] = ["sideways"]
    with pytest.raises(MatrixError, match=r"directions.*'sideways' must be one of 'download' or 'upload'"):
        parse_matrix(data, MATRIX)


def test_the_command_line_picks_directions(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--preset", "ci", "--target", "grpc", "--direction", "upload", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "grpc.small.c100.closed.upload.r1" in out
    assert "grpc.small.c100.closed.r1" not in out


def test_the_upload_body_is_the_pools_first_records_and_knows_their_checksum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc",), directions=("upload",)))
    scenario = plan.scenarios[0]
    body = upload_body(tmp_path, scenario)
    assert body is not None and body.count == scenario.count == 100
    sent = orjson.loads(body.path.read_bytes())
    assert sent == {"records": load_pool(10_000, 42)[:100]}
    # The checksum, computed here by its definition on the protobuf the gRPC server decodes.
    request = cars_pb2.CreateRecordsRequest()
    json_format.Parse(body.path.read_bytes(), request)
    expected = sum(
        r.car.year
        + r.car.mileage
        + sum(len(s) for s in (r.car.make, r.car.model, r.car.trim, r.car.color))
        + sum(len(s) for s in (r.driver.firstname, r.driver.lastname, r.driver.driver_id))
        for r in request.records
    )
    assert body.checksum == expected % 2**32 and expected > 0
    # Written once: the next scenario of the same pool and count reuses the file.
    mtime = body.path.stat().st_mtime_ns
    assert upload_body(tmp_path, scenario) == body and body.path.stat().st_mtime_ns == mtime
    download = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("grpc",))).scenarios[0]
    assert upload_body(tmp_path, download) is None


def test_a_count_beyond_the_pool_cycles_through_it(tmp_path: Path) -> None:
    data = copy.deepcopy(tomllib.loads(MATRIX.read_text()))
    data["targets"]["grpc"]["env"] = {"RECORD_POOL_SIZE": "3"}
    overrides = Overrides(targets=("grpc",), directions=("upload",), counts=(7,))
    scenario = expand(parse_matrix(data, MATRIX), "local", "ci", overrides).scenarios[0]
    body = upload_body(tmp_path, scenario)
    assert body is not None and body.path.name == "upload-p3-s42-c7.json"
    pool = load_pool(3, 42)
    assert orjson.loads(body.path.read_bytes())["records"] == [pool[i % 3] for i in range(7)]


def _handle() -> ServiceHandle:
    address = Endpoint("127.0.0.1", 8081)
    return ServiceHandle("s", "rest_aiohttp", address, address, None, None, 1, "cgroup-v1", (1,), (0,))


@pytest.mark.parametrize("direction", ["download", "upload"])
def test_k6_is_told_the_upload_file_only_for_an_upload(tmp_path: Path, direction: str) -> None:
    overrides = Overrides(targets=("aiohttp-h1",), directions=(direction,))
    scenario = expand(load_matrix(MATRIX), "local", "ci", overrides).scenarios[0]
    invocation = K6Setup(
        scenario,
        _handle(),
        run_id="r1",
        root=ROOT,
        ca_file=tmp_path / "ca.pem",
        k6_dir=tmp_path,
        log_file=tmp_path / "k6.log",
        influxdb_url=None,
        upload=upload_body(tmp_path, scenario),
    ).window()
    upload_env = {k: v for k, v in invocation.env.items() if k.startswith("UPLOAD_")}
    if direction == "download":
        assert upload_env == {}
    else:
        assert upload_env == {
            "UPLOAD_FILE": str(tmp_path / "upload-p10000-s42-c100.json"),
            "UPLOAD_COUNT": "100",
        }


def _result(
    scenario_id: str, target: str, protocol: str, direction: str | None, rps: float
) -> dict[str, Any]:
    scenario: dict[str, Any] = {
        "id": f"{scenario_id}.r1",
        "group": scenario_id,
        "target": target,
        "service": "rest_aiohttp" if protocol != "grpc" else "grpc_aio",
        "script": "k6/rest.js" if protocol != "grpc" else "k6/grpc_unary.js",
        "protocol": protocol,
        "tls": False,
        "profile": {"name": "small", "cpus": 1.0, "memory_bytes": 2**30},
        "count": 100,
        "response_model": "build",
        "load_model": {"name": "closed", "executor": "constant-vus", "vus": 10},
        "repeat": 1,
    }
    if direction is not None:  # None: a result written before directions existed
        scenario["direction"] = direction
    return {
        "scenario_id": scenario["id"],
        "scenario": scenario,
        "status": "ok",
        "k6": {"metrics": {"requests_per_second": rps}},
    }


def test_uploads_compare_only_with_uploads_and_old_results_are_downloads() -> None:
    results = [
        _result("aiohttp-h1.small.c100.closed", "aiohttp-h1", "http1.1", None, 1000.0),
        _result("grpc.small.c100.closed", "grpc", "grpc", "download", 800.0),
        _result("aiohttp-h1.small.c100.closed.upload", "aiohttp-h1", "http1.1", "upload", 500.0),
        _result("grpc.small.c100.closed.upload", "grpc", "grpc", "upload", 900.0),
    ]
    groups = group_results(parse_results(results))
    assert [g.direction for g in groups] == ["download", "download", "upload", "upload"]
    pairs = [(c.candidate.id, c.baseline.id) for c in compare_groups(groups) if c.kind == "gRPC vs REST"]
    assert pairs == [
        ("grpc.small.c100.closed", "aiohttp-h1.small.c100.closed"),
        ("grpc.small.c100.closed.upload", "aiohttp-h1.small.c100.closed.upload"),
    ]
    upload = groups[3]
    assert upload.context == "small, c100, closed, upload"
