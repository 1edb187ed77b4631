"""Capacity search end to end: a bounded search on a real service with real k6."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.local_runs import quick_benchmark
from tests.support import QUICK_CALIBRATION, ROOT

pytestmark = pytest.mark.paired  # what the search decided, no figure judged


def test_bounded_search_on_a_real_service(tmp_path: Path) -> None:
    # At most 3 steps of 2 s, after one 1 s warm-up: about 20 s with the service's start.
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text().replace("max_steps = 8", "max_steps = 3"))
    out = tmp_path / "capacity-ci"
    quick_benchmark(out)  # the serialization benchmark is not under test here (test_e2e_local's run has it)
    completed = subprocess.run(
        [
            sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
            "--backend", "local", "--matrix", str(matrix),
            "--preset", "ci", "--target", "grpc", "--load-model", "capacity",
            "--duration", "2s", "--warmup", "1s", "--out", str(out), "--prometheus-targets", "",
            "--influxdb", "none", "--prometheus", "none",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    [path] = (out / "scenarios").glob("*.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok" and result["scenario"]["profile"]["name"] == "small"
    search = result["capacity"]
    steps = search["steps"]
    # The search stopped where it was told to: at most max_steps runs of the 2 s window given.
    assert search["max_steps"] == 3 and 1 <= len(steps) <= 3 and steps[0]["rate"] == 50
    assert result["scenario"]["duration_s"] == 2, result["scenario"]
    assert [s["number"] for s in steps] == list(range(1, len(steps) + 1))
    assert (
        search["sustainable_rate"] is not None and search["sustainable_rate"] >= 50
    )  # 50/s is easy at 0.5 CPU
    assert search["limit"]
    for step in steps:
        assert (out / "k6" / f"{result['scenario_id']}.step{step['number']}.json").is_file()
        assert step["passed"] == (not step["reasons"])
        assert step["service_cpu_utilisation"] is not None and 0 < step["service_cpu_utilisation"] < 1.5
    # The result's k6 section is the run at the sustainable rate.
    assert result["k6"]["metrics"]["requests_per_second"] == pytest.approx(
        search["sustainable_rate"], rel=0.1
    )
    report = (out / "report.md").read_text()
    assert "## Capacity" in report and "capacity.png" in report
