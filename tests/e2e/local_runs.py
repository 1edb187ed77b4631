"""Helpers of the local backend's e2e runs under interruption: run_matrix.py started as a user's
terminal would (its own session, so a Ctrl-C to its group reaches it and its k6), and what a run
leaves behind.

Every run is marked by an environment variable its services inherit, so leftovers are found
in /proc by what they are, not by name: a process whose environment holds the marker or the
run's directory, or whose command line holds the run id (k6 gets `--tag run=<id>`).
"""

import csv
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.report.serialization import QUICK, as_document
from labrunner.report.serialization import run as run_serialization

from services.common.cgroup import own_cgroup
from tests.support import ROOT, run_matrix_command, seed_keeping_matrix_order

MARKER = "PROTOLAB_TEST_RUN"
FIRST = "aiohttp-h1.small.c100.closed.r1"
SECOND = "grpc.small.c100.closed.r1"
# Two fast scenarios, measured for 1 s each without warm-up, FIRST first; no InfluxDB, no Prometheus.
TWO = Overrides(targets=("aiohttp-h1", "grpc"))
IN_ORDER = seed_keeping_matrix_order(expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", TWO))
SELECTION = (
    "--preset", "ci", "--target", "aiohttp-h1,grpc", "--duration", "1s", "--warmup", "0", "--seed", IN_ORDER,
)  # fmt: skip
QUIET = ("--influxdb", "none", "--prometheus", "none", "--prometheus-targets", "")
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class Run:
    """One run_matrix.py process and where it writes."""

    out: Path
    marker: str
    process: subprocess.Popen[bytes]

    @property
    def run_id(self) -> str:
        return self.out.name

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return (self.out.parent / f"{self.run_id}.output").read_text(errors="replace")


def quick_benchmark(out: Path) -> None:
    """The serialization benchmark is not under test: a quick one in place saves ~10 s per run
    (the report skips the benchmark when its file exists)."""
    document = as_document(run_serialization(QUICK), QUICK)
    write_json_atomic(out / "serialization.json", document)


def finished_run(out: Path, *args: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """run_matrix.py with args (QUIET, into `out`, with a quick serialization benchmark there) to its
    end, which must be a success; its output and its results by scenario id."""
    out.mkdir()
    quick_benchmark(out)
    completed = subprocess.run(
        run_matrix_command(*args, *QUIET, "--out", str(out)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = {path.stem: json.loads(path.read_text()) for path in (out / "scenarios").glob("*.json")}
    return completed.stdout, results


def start_run(out: Path, *args: str, marker: str | None = None) -> Run:
    """run_matrix.py in its own session (so a Ctrl-C to its group is a Ctrl-C to it and its k6)."""
    marker = marker or uuid.uuid4().hex
    out.parent.mkdir(parents=True, exist_ok=True)
    log = (out.parent / f"{out.name}.output").open("ab")
    process = subprocess.Popen(
        run_matrix_command("--backend", "local", "--out", str(out), *QUIET, *args),
        cwd=ROOT,
        env={**os.environ, MARKER: marker},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return Run(out, marker, process)


def read_file(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone, or a kernel thread
        return ""


def processes_of(run: Run) -> list[str]:
    """Command lines of the live processes that belong to the run (see the module docstring)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        stat = read_file(proc / "stat")
        if not stat or stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        cmdline, environ = read_file(proc / "cmdline"), read_file(proc / "environ")
        if (
            f"{MARKER}={run.marker}" in environ
            or str(run.out) in environ + cmdline
            or f"run={run.run_id}" in cmdline
        ):
            found.append(f"{proc.name}: {cmdline}")
    return found


def cgroups_of(run: Run) -> list[Path]:
    """The run's scenario cgroups still present: the local backend names them <run id>-<scenario>."""
    own = own_cgroup()
    parents = {
        own.cpu / "protolab",
        own.cpuacct / "protolab",
        own.memory / "protolab",
        Path("/sys/fs/cgroup/protolab"),
    }
    return sorted(path for parent in parents for path in parent.glob(f"{run.run_id}-*"))


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll condition every 0.25 s: a scan of /proc (processes_of) costs about 5 ms of CPU, which at
    every 0.05 s was a tenth of a CPU, enough for the run's calibration to find the host busy (over
    its 5%) and wait 5 s, twice, and for its scenarios to be marked suspect."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def k6_measuring(run: Run, scenario: str) -> bool:
    return any("k6" in line and f"scenario={scenario}" in line for line in processes_of(run))


def results(out: Path) -> dict[str, dict]:
    """Every result file, parsed: a half-written one fails the test here."""
    return {path.stem: json.loads(path.read_text()) for path in (out / "scenarios").glob("*.json")}


def summary_rows(out: Path) -> set[tuple[str, str, str]]:
    """summary.csv's identity columns: which scenarios, with which status and target."""
    with (out / "summary.csv").open() as handle:
        return {(row["scenario"], row["status"], row["target"]) for row in csv.DictReader(handle)}


def assert_nothing_left(run: Run, timeout: float = 10) -> None:
    """No process, cgroup or services' metrics directory of the run survives it (k6 may need its last
    second to exit)."""
    deadline = time.monotonic() + timeout
    while (processes_of(run) or cgroups_of(run)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_of(run), processes_of(run)
    assert not cgroups_of(run), cgroups_of(run)
    assert not metrics_dirs_of(run), metrics_dirs_of(run)


def metrics_dirs_of(run: Run) -> list[Path]:
    """The run's services' prometheus_client directories still in the temp directory."""
    return list(Path(tempfile.gettempdir()).glob(f"protolab-metrics-{run.run_id}-*"))
