"""Results written by an older release still serve as a baseline, and are not resumed by another
methodology: tests/fixtures/run-0.2.0 is a real run of release 0.2.0's code (methodology v2),
interrupted in its last scenario (tests/fixtures/README.md).

The runs here use this code with real servers and k6 on the local backend, 1 s per scenario; the
serialization benchmark, not under test, is written quickly in place beforehand."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from labrunner.files import write_json_atomic
from labrunner.report.sections.baseline import DIFFERENT_HOST
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization
from labrunner.results import methodology

from tests.support import ROOT, run_matrix_command

FIXTURE = ROOT / "tests" / "fixtures" / "run-0.2.0"
RUN_ID = "20261204-old020"  # the fixture's manifest's
OLD_COMMIT = "732ae75971e71b7a3b09a024ee81855a53376d0b"
DONE = ("grpc.small.c100.closed.r1", "aiohttp-h1.small.c100.closed.r1", "grpc.small.c100.closed.r2")
INTERRUPTED = "aiohttp-h1.small.c100.closed.r2"
# The fixture's selection (its manifest's argv), measured for 1 s instead of 3 s.
SELECTION = (
    "--preset", "ci", "--target", "aiohttp-h1,grpc", "--duration", "1s", "--warmup", "0", "--repeats", "2",
    "--seed", "1",
)  # fmt: skip
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")

pytestmark = [pytest.mark.timeout(240), pytest.mark.paired]  # statuses and baselines, no figure judged


def _run_matrix(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    write_json_atomic(out / "serialization.json", as_document(run_serialization(QUICK), QUICK))
    return subprocess.run(
        run_matrix_command("--backend", "local", "--out", str(out), *QUIET, *SELECTION, *args),
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=200,
    )


def test_the_fixture_is_an_interrupted_run_of_release_0_2_0() -> None:
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    assert (manifest["run_id"], manifest["release"], manifest["complete"]) == (RUN_ID, "0.2.0", False)
    assert manifest["git"] == {"sha": OLD_COMMIT, "dirty": False}
    assert sorted(p.stem for p in (FIXTURE / "scenarios").glob("*.json")) == sorted(DONE)


def test_this_code_refuses_to_resume_a_run_another_methodology_measured(tmp_path: Path) -> None:
    """Release 0.2.0 measured by methodology v2; this code measures v3 (duet blocks, ladders at shares
    of capacity): one run holds one method, so --resume says so and changes nothing of the old run."""
    out = tmp_path / "moved"
    shutil.copytree(FIXTURE, out)
    run = _run_matrix(out, "--resume")
    assert run.returncode == 2, (run.stdout + run.stderr)[-4000:]
    assert f"was measured by methodology v2, this release measures v{methodology.VERSION}" in run.stderr
    assert "start a new run" in run.stderr
    for path in FIXTURE.rglob("*"):
        if path.is_file():
            assert (out / path.relative_to(FIXTURE)).read_bytes() == path.read_bytes(), path


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of this code, the baseline cases' "now"."""
    out = tmp_path_factory.mktemp("fresh") / "now"
    run = _run_matrix(out)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return out


def _baseline_on(host: str, run: Path, tmp_path: Path) -> Path:
    """A copy of the fixture whose fingerprint is this host's ("same") or one no host has ("foreign").

    The fixture was recorded on one VM; rewriting its fingerprint makes each case hold on any host."""
    baseline = tmp_path / "baseline"
    shutil.copytree(FIXTURE, baseline)
    manifest = json.loads((baseline / "manifest.json").read_text())
    here = json.loads((run / "manifest.json").read_text())
    fingerprint = dict(here["fingerprint"])
    if host == "foreign":
        fingerprint["kernel"] = "0.0.0-not-a-kernel"
        fingerprint["cpu_model"] = "No Such CPU"
    manifest["fingerprint"] = fingerprint
    manifest["host"] = {**manifest["host"], "cpu_model": fingerprint["cpu_model"]}
    write_json_atomic(baseline / "manifest.json", manifest)
    return baseline


def _baseline_rows(run: Path, baseline: Path) -> tuple[str, dict[str, str]]:
    """The report's section against the baseline, and its table rows by group."""
    report = subprocess.run(
        [sys.executable, "scripts/report.py", str(run), "--baseline", str(baseline)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, (report.stdout + report.stderr)[-4000:]
    text = (run / "report.md").read_text()
    section = text[text.index(f"## Against baseline run {RUN_ID}") :]
    assert f"Code: `{OLD_COMMIT}` then" in section
    assert "2 groups present in both runs" in section
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| `")}
    return section, rows


def test_a_run_of_release_0_2_0_on_this_host_serves_as_the_baseline(fresh_run: Path, tmp_path: Path) -> None:
    section, rows = _baseline_rows(fresh_run, _baseline_on("same", fresh_run, tmp_path))
    assert "The runs come from different hosts" not in section
    # The interrupted run has one aiohttp-h1 repeat: shown, not judged; grpc has two on each side.
    assert "| 1 / 2 |" in rows["`aiohttp-h1.small.c100.closed`"]
    assert "one repeat: cannot judge" in rows["`aiohttp-h1.small.c100.closed`"]
    assert "| 2 / 2 |" in rows["`grpc.small.c100.closed`"]
    assert "cannot judge" not in rows["`grpc.small.c100.closed`"]
    assert DIFFERENT_HOST not in section


def test_a_run_of_release_0_2_0_on_another_host_is_shown_not_judged(fresh_run: Path, tmp_path: Path) -> None:
    section, rows = _baseline_rows(fresh_run, _baseline_on("foreign", fresh_run, tmp_path))
    assert "The runs come from different hosts" in section
    assert "cpu_model: No Such CPU ->" in section and "kernel: 0.0.0-not-a-kernel ->" in section
    # No absolute change is judged across hosts: every group says so, whatever its repeats.
    assert "| 1 / 2 |" in rows["`aiohttp-h1.small.c100.closed`"]
    assert all(DIFFERENT_HOST in row for row in rows.values()), rows
