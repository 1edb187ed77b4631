"""The report of a real small run: run_matrix.py with real k6 on two targets, two repeats, the
closed, the equal-load (open) and the sequential model; then report.py regenerates it against a
baseline."""

import copy
import itertools
import json
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image

from tests.e2e.local_runs import quick_benchmark
from tests.support import QUICK_CALIBRATION, ROOT

# Judged on what it wrote (files, tables, a baseline made slower by hand), never on a figure: a group
# k6 limited is read as the lower bound the report rightly calls it.
pytestmark = pytest.mark.paired

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report-ci"
    quick_benchmark(out)  # the serialization benchmark is not under test here (test_e2e_local's run has it)
    completed = subprocess.run(
        [
            sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION,
            "--backend", "local", "--preset", "ci",
            "--target", "aiohttp-h1,grpc", "--load-model", "closed,equal-load,seq-100",
            "--repeats", "2", "--duration", "2s", "--warmup", "1s",
            "--out", str(out), "--prometheus-targets", "", "--influxdb", "none", "--prometheus", "none",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert "report: " in completed.stdout
    return out


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 100 and image.height > 100


def test_run_writes_the_report_files(run_dir: Path) -> None:
    for name in ("report.md", "report.html", "payload.json", "serialization.json"):
        assert (run_dir / name).is_file(), name
    charts = sorted(p.name for p in (run_dir / "charts").glob("*.png"))
    assert {"throughput.png", "latency.png", "cpu_per_1k_requests.png", "bytes_per_response.png"} <= set(
        charts
    )
    assert {"sequential.png", "serialization.png"} <= set(charts)
    for chart in (run_dir / "charts").glob("*.png"):
        _assert_png(chart)


def test_report_tables_hold_the_runs_scenarios(run_dir: Path) -> None:
    md = (run_dir / "report.md").read_text()
    results = [json.loads(p.read_text()) for p in (run_dir / "scenarios").glob("*.json")]
    assert len(results) == 12
    groups = {r["scenario"]["group"] for r in results}
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    # A closed group is a lower bound when k6, not the service, limited a repeat (aiohttp at 0.5 CPU
    # can outrun k6 on 2 CPUs): its row says so, a bullet under the table says how many repeats,
    # and the group enters no comparison.
    bullet = r"^- `{}`: [12] of 2 repeats not service-bound"
    lower_bounds = {g for g in groups if re.search(bullet.format(re.escape(g)), summary, re.M)}
    for group in sorted(g for g in groups if g.endswith(".closed")):
        row = f"| `{group}` (lower bound) | 2/2 |" if group in lower_bounds else f"| `{group}` | 2/2 |"
        assert row in summary, group
    sequential = md.split("## Sequential latency", 1)[1].split("\n## ", 1)[0]
    assert "| aiohttp-h1 | http1.1 | small | 100 | 100 | 2 |" in sequential
    assert "| grpc | grpc | small | 100 | 100 | 2 |" in sequential
    closed_pair = "gRPC vs REST | grpc | aiohttp-h1 | small, c100, closed |"
    compared = not lower_bounds & {"aiohttp-h1.small.c100.closed", "grpc.small.c100.closed"}
    assert (closed_pair in md) == compared, lower_bounds
    assert "gRPC vs REST | grpc | aiohttp-h1 | small, c100, seq-100 |" in md
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["git"]["sha"] in md and manifest["versions"]["k6"] in md
    for count in ("| 1 |", "| 10 |", "| 100 |", "| 1000 |"):
        assert count in md.split("## Payload size", 1)[1]
    bench = md.split("## Serialization micro-benchmark", 1)[1]
    for codec in ("orjson", "json", "protobuf"):
        assert f"| {codec} | encode |" in bench and f"| {codec} | decode |" in bench


# A scenario's phases by what they are (not the runner's own lists): before the measured window the
# service's start, health check and verification and the wait for the previous scenario's finish lie
# on the run's critical path; after it the final scrape, the stop and the collect are the finish,
# which overlaps the next scenario's start on loopback; warm-up and measured window are k6's time.
ON_PATH = ("start", "health", "verify", "waited")
FINISH = ("scrape", "stop", "collect")
K6_TIME = ("warmup", "measure")
SUMS = ("overhead", "overlapped", "total")
ALWAYS = {"start", "health", "verify", "measure", "stop", "collect"}  # scrape: only with Prometheus
ROUNDING_S = 0.005  # each phase is written rounded to the millisecond


def test_each_service_stops_while_the_next_starts_and_before_its_measured_window(run_dir: Path) -> None:
    results = [json.loads(p.read_text()) for p in (run_dir / "scenarios").glob("*.json")]
    results.sort(key=lambda r: r["started_at"])
    assert len(results) == 12
    for previous, current in itertools.pairwise(results):
        timings = current["timings_s"]
        started = datetime.fromisoformat(current["started_at"])
        phases = ("start", "health", "verify", "warmup", "waited")
        window_opens = started + timedelta(seconds=sum(timings.get(phase, 0.0) for phase in phases))
        finished = datetime.fromisoformat(previous["finished_at"])
        # The phases' sum falls short of the real time by the few steps between them.
        assert started < finished <= window_opens + timedelta(seconds=0.05), previous["scenario_id"]
        done = previous["timings_s"]
        # Its finish ran beside the next scenario's start: off the path, and counted as overlapped.
        assert done["overlapped"] == pytest.approx(sum(done.get(p, 0.0) for p in FINISH), abs=ROUNDING_S)
        assert done["overhead"] == pytest.approx(sum(done.get(p, 0.0) for p in ON_PATH), abs=ROUNDING_S)
    last = results[-1]["timings_s"]
    assert "overlapped" not in last  # the last one's finish is the run's, on its path
    assert last["overhead"] == pytest.approx(sum(last.get(p, 0.0) for p in (*ON_PATH, *FINISH)), abs=0.01)
    for result in results:
        done = result["timings_s"]
        # Every phase is one of those, each that always runs is there, and none counts twice.
        assert ALWAYS <= set(done) <= {*ON_PATH, *FINISH, *K6_TIME, *SUMS}, result["scenario_id"]
        spent = sum(seconds for phase, seconds in done.items() if phase not in SUMS)
        assert spent <= done["total"] + 0.01, result["scenario_id"]
        assert done["overhead"] + done.get("overlapped", 0.0) + sum(done.get(p, 0.0) for p in K6_TIME) == (
            pytest.approx(spent, abs=0.01)
        ), result["scenario_id"]


def test_html_is_self_contained_with_the_same_tables(run_dir: Path) -> None:
    md = (run_dir / "report.md").read_text()
    page = (run_dir / "report.html").read_text()
    images = md.count("![")
    assert images >= 6 and page.count('src="data:image/png;base64,') == images
    assert 'src="charts/' not in page and "<link" not in page and "<script" not in page
    rules = [line for line in md.splitlines() if re.fullmatch(r"\|((---|--:)\|)+", line)]
    assert len(rules) == page.count("<table>") >= 5
    closed = sorted((run_dir / "scenarios").glob("*.closed.*"))
    assert closed, "no closed-model scenario: the groups below would go unchecked"
    for path in closed:
        assert json.loads(path.read_text())["scenario"]["group"] in page
    assert "small, c100, seq-100" in page


def test_report_cli_regenerates_and_flags_regressions(run_dir: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "baseline-run"
    shutil.copytree(run_dir, baseline, ignore=shutil.ignore_patterns("report.*", "charts"))
    for path in (baseline / "scenarios").glob("*.closed.r*.json"):
        result = json.loads(path.read_text())
        faster = copy.deepcopy(result)
        faster["k6"]["metrics"]["requests_per_second"] *= 100  # the baseline was far faster
        path.write_text(json.dumps(faster))
    completed = subprocess.run(
        [sys.executable, "scripts/report.py", str(run_dir), "--baseline", str(baseline)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    md = (run_dir / "report.md").read_text()
    assert "## Against baseline run report-ci" in md and str(baseline) in md  # the run id is the copy's
    assert "req/s vs report-ci" in md
    assert md.count("**REGRESSION**") == 2  # req/s of both closed groups
    unchanged = subprocess.run(
        [sys.executable, "scripts/report.py", str(run_dir), "--baseline", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert unchanged.returncode == 0, unchanged.stderr
    assert "No regression among 6 groups" in (run_dir / "report.md").read_text()
