"""Preset caller for real, tiny: run_matrix.py --preset caller on the local backend (real servers, real
cgroups, every caller process lab and floor), both directions, one count, one round of short windows.
Every caller did the pool's work, its result is written, the report has its section, and the findings
name every pair; a caller whose pool differs from the server's is refused before measuring."""

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.common.records import checksum, load_pool, record_from_json
from tests.support import ROOT

COUNT = 10
TARGETS = ("aiohttp-h1", "grpc", "granian-h2-tls")  # the preset's, in the matrix's order
DIRECTIONS = ("download", "upload")
VARIANTS = ("lab", "floor")

# Callers under cgroup quotas, judged on what they did (verified pools, quotas set, findings named),
# never on a figure.
pytestmark = pytest.mark.paired


@pytest.fixture(scope="module")
def caller_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("caller") / "run"
    completed = subprocess.run(
        [
            sys.executable,
            "scripts/run_matrix.py",
            "--backend",
            "local",
            "--preset",
            "caller",
            "--count",
            str(COUNT),
            "--repeats",
            "1",
            "--warmup",
            "0.3s",
            "--duration",
            "0.5s",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    return completed, out


def _results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in (out / "callers").glob("*.r1.json")]


def test_every_caller_lab_and_floor_did_the_pools_work_in_both_directions(
    caller_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, out = caller_run
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = _results(out)
    seen = {(r["target"]["name"], r["caller"]["variant"], r["direction"]) for r in results}
    assert seen == set(itertools.product(TARGETS, VARIANTS, DIRECTIONS))
    # The pool's first records as the servers map it, apart from the callers' own mapping.
    expected = checksum(record_from_json(record) for record in load_pool(10_000, 42)[:COUNT])
    for r in results:
        assert r["status"] == "ok", (r["id"], r["error"], r["log_tail"])
        assert r["verified"]["checksum"] == expected, r["id"]
        assert r["window"]["calls"] > 0 and r["window"]["cpu_seconds"] > 0, r["id"]
        # The caller's own cgroup, as it read it over its window: at the profile's quota.
        assert r["window"]["cpu_limit_cores"] == r["caller"]["profile"]["cpus"] == 0.25, r["id"]
        assert r["figures"]["server_cpu_per_call_us"] > 0, r["id"]


def test_the_findings_name_every_pair_of_callers_and_each_against_its_floor(
    caller_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, out = caller_run
    # The terminal wraps a finding longer than its lines: read each sentence whole.
    text = " ".join(completed.stdout.split())
    for direction in DIRECTIONS:
        call = re.escape(f"{COUNT} records, {direction}.")
        for baseline, candidate in itertools.combinations(TARGETS, 2):
            said = re.findall(
                rf"calling {candidate} from Python cost the caller (?:(?!calling ).)*? the CPU of calling "
                rf"{baseline}, {call}",
                text,
            )
            assert len(said) == 1, (candidate, baseline, direction, completed.stdout[-3000:])
        for target in TARGETS:
            said = re.findall(rf"the lab's {target} caller cost (?:(?!the lab's ).)*?{call}", text)
            assert len(said) == 1, (target, direction)
    report = (out / "report.md").read_text()
    assert "## The caller's cost" in report and "## Findings" in report
    assert (out / "report.html").is_file()


def test_a_caller_whose_pool_is_not_the_servers_is_refused_before_measuring(start_service: Any) -> None:
    service = start_service("rest_aiohttp", {"WORKERS": "1"})
    env = {
        **os.environ,
        "CALLER_ADDRESS": f"127.0.0.1:{service.port}",
        "CALLER_DIRECTION": "download",
        "CALLER_COUNT": str(COUNT),
        "RECORD_SEED": "7",  # the server's is 42
    }
    for module in ("benchmarks.callers.aiohttp_h1", "labrunner.callers.aiohttp_h1"):
        completed = subprocess.run(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        events = [json.loads(line) for line in completed.stdout.splitlines()]
        assert completed.returncode == 1, module
        assert [e["event"] for e in events] == ["failed"], module
        assert "Mismatch: the download decoded other records than the pool's first 10" in events[0]["error"]
