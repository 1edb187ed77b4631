"""End to end, the user's own message (issue 38 item 2's done-when): run_matrix.py --proto with a .proto
none of the lab's code knows (tests/fixtures/user_proto/weather.proto: a nested message, an enum, a map
and a repeated double) on the local backend with real k6 (REST and gRPC, a second each) compiles it,
verifies every server's bytes against the same records (one canonical checksum on every server), measures
and gives findings; the manifest says which message and how its records were made. One small run: the
parallel phase's integration test covers every stack (tests/integration/test_user_message_servers.py)."""

import json
import re
from pathlib import Path

import pytest

from tests.e2e.local_runs import finished_run
from tests.e2e.test_shape_run import SELECTION as SHAPE_RUN
from tests.support import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.paired]  # bytes verified and results written, no figure judged
# test_shape_run's small run, with unary gRPC beside REST: a pair the findings compare (gRPC vs REST).
SELECTION = tuple("aiohttp-h1,grpc" if arg == "aiohttp-h1,grpc-stream" else arg for arg in SHAPE_RUN)
WEATHER = ROOT / "tests" / "fixtures" / "user_proto" / "weather.proto"
PROTO = ("--proto", str(WEATHER), "--message", "weather.v1.Observation")
CHECKSUM = re.compile(r"the pool's records \(canonical checksum ([0-9a-f]{8})\)")


def test_a_user_proto_run_verifies_equal_work_and_gives_findings(tmp_path: Path) -> None:
    out = tmp_path / "user-proto-run"  # the run id names its cgroups: unique among the paired phase
    output, results = finished_run(out, *SELECTION, *PROTO)
    assert set(results) == {"aiohttp-h1.small.c10.closed.proto.r1", "grpc.small.c10.closed.proto.r1"}
    checksums = set()
    for scenario_id, result in results.items():
        assert result["status"] == "ok" and result["scenario"]["shape"] == "proto", scenario_id
        found = {m[1] for check in result["verification"]["checks"] if (m := CHECKSUM.search(check))}
        assert found, scenario_id
        checksums |= found
        assert result["k6"]["metrics"]["requests"] > 0
    assert len(checksums) == 1, checksums  # the same records from every server: equal work
    assert "findings:" in output and "proto records" in output
    manifest = json.loads((out / "manifest.json").read_text())
    described = manifest["settings"]["user_message"]
    assert described["message"] == "weather.v1.Observation" and described["records"]["string_chars"] == 16
    assert (out / "shape" / "records.protoset").is_file()
