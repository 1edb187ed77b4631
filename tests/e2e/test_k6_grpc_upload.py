"""Real k6 uploading to a real lab gRPC server for 40 calls: k6/grpc_unary.js (CreateRecords) and
k6/grpc_stream.js (UploadRecords) with UPLOAD_FILE, as the runner sets it. Every call k6 makes reaches
the server as an upload of the file's records, k6's checks of the reply pass, and a refused upload or a
file that disagrees with UPLOAD_COUNT fails the run."""

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from labrunner.run.k6.output import K6Metrics, parse_summary
from prometheus_client.parser import text_string_to_metric_families

from services.common.records import load_pool
from tests.support import (
    GRPC_SERVERS,
    ROOT,
    RunningService,
    fixed_calls,
    k6_env,
    launch_service,
    stream_end_lost,
)

SERVICE = "protolab.cars.v1.RecordService"
POOL_SIZE, SEED, COUNT = 2000, 42, 100
# A fixed number of calls, not a duration: a call in flight when a duration ends reaches the server but
# not k6's count (CI once saw the server handle 147 uploads to k6's 146).
CALLS = 40
ENV = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED)}
# Each script's upload method, and the messages the server receives per call.
SCRIPTS = {"grpc_unary.js": ("CreateRecords", 1), "grpc_stream.js": ("UploadRecords", COUNT)}
# k6 exit codes: thresholds failed, script exception.
K6_THRESHOLDS_FAILED = 99
K6_SCRIPT_EXCEPTION = 107

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(180)]  # answers checked, nothing measured


def k6_binary() -> str:
    """k6 on PATH or next to this Python (the lab's venv, where scripts/setup.sh installs it)."""
    found = shutil.which("k6") or str(Path(sys.executable).parent / "k6")
    assert Path(found).is_file(), "k6 not found: run scripts/setup.sh"
    return found


@pytest.fixture(scope="module")
def upload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The body the runner writes: the pool's first COUNT records in their canonical JSON."""
    path = tmp_path_factory.mktemp("upload") / "upload.json"
    path.write_bytes(orjson.dumps({"records": load_pool(POOL_SIZE, SEED)[:COUNT]}))
    return path


@pytest.fixture(scope="module", params=GRPC_SERVERS)
def service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    started = launch_service(str(request.param), ENV)
    yield started
    assert started.stop() == 0


def run_k6(
    script: str, service: RunningService, upload: Path, summary: Path, **settings: str
) -> subprocess.CompletedProcess[str]:
    env = k6_env(
        service.port,
        grpc=True,
        **{
            "UPLOAD_FILE": str(upload),
            "UPLOAD_COUNT": str(COUNT),
            **fixed_calls(CALLS, 2),
            "CHECK_EVERY": "5",  # many replies decoded and checked
            "SUMMARY_FILE": str(summary),
            **settings,
        },
    )
    return subprocess.run(
        [k6_binary(), "run", "--quiet", "--no-color", str(ROOT / "k6" / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(service: RunningService) -> Samples:
    text = urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5).read()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.labels.get("grpc_service") == SERVICE
    }


def method_counts(samples: Samples, method: str) -> dict[str, float]:
    """A method's calls by grpc_code, and its messages received, summed over the series."""
    counts: dict[str, float] = {}
    for (name, labels), sample in samples.items():
        label = dict(labels)
        if label.get("grpc_method") != method:
            continue
        if name == "grpc_server_handled_total":
            counts[label["grpc_code"]] = counts.get(label["grpc_code"], 0) + sample
        elif name in ("grpc_server_started_total", "grpc_server_msg_received_total"):
            counts[name] = counts.get(name, 0) + sample
    return counts


def counts_after(
    service: RunningService, before: Samples, method: str, expected: dict[str, float]
) -> dict[str, float]:
    """The method's counts since `before`, once they are `expected` or 10 s have passed. A worker writes
    its series every 0.5 s, after the client has its answer, one series after another: a scrape between
    two of those writes sees started_total ahead of the others."""
    deadline = time.monotonic() + 10
    while True:
        now, then = method_counts(scrape(service), method), method_counts(before, method)
        moved = {key: count - then.get(key, 0) for key, count in now.items() if count != then.get(key, 0)}
        if moved == expected or time.monotonic() > deadline:
            return moved


def summary_of(completed: subprocess.CompletedProcess[str], summary: Path) -> K6Metrics:
    assert summary.is_file(), completed.stdout + completed.stderr[-2000:]
    return parse_summary(orjson.loads(summary.read_bytes()))


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_k6_uploads_the_file_and_checks_each_reply(
    service: RunningService, upload_file: Path, tmp_path: Path, script: str
) -> None:
    method, messages = SCRIPTS[script]
    before = scrape(service)
    completed = run_k6(script, service, upload_file, tmp_path / "summary.json")
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    k6 = summary_of(completed, tmp_path / "summary.json")
    assert CALLS - stream_end_lost(script) <= k6.requests <= CALLS
    assert k6.errors == 0 and k6.attempts == k6.requests
    # The decoded replies' checks (count and checksum of the file's records, and status) all passed.
    assert k6.checks_passed >= 3 and k6.checks_failed == 0
    # Every call k6 made is an upload of the file's records: no ListRecords or StreamRecords.
    uploads = {
        "grpc_server_started_total": CALLS,
        "OK": CALLS,
        "grpc_server_msg_received_total": CALLS * messages,
    }
    assert counts_after(service, before, method, uploads) == uploads
    for download in ("ListRecords", "StreamRecords"):
        assert counts_after(service, before, download, {}) == {}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_refused_upload_fails_the_run(
    start_service: Callable[..., RunningService], upload_file: Path, tmp_path: Path, script: str
) -> None:
    # The file holds one record too many.
    refusing = start_service("grpc_aio", {**ENV, "MAX_COUNT": str(COUNT - 1), "DEFAULT_COUNT": "1"})
    completed = run_k6(script, refusing, upload_file, tmp_path / "summary.json")
    assert completed.returncode == K6_THRESHOLDS_FAILED, completed.stdout + completed.stderr[-2000:]
    k6 = summary_of(completed, tmp_path / "summary.json")
    assert k6.requests == 0 and k6.errors > 0
    assert f"records: expected 1 to {COUNT - 1} records, got {COUNT}" in completed.stderr


def test_a_file_that_disagrees_with_upload_count_stops_k6(
    service: RunningService, upload_file: Path, tmp_path: Path
) -> None:
    completed = run_k6("grpc_unary.js", service, upload_file, tmp_path / "summary.json", UPLOAD_COUNT="99")
    assert completed.returncode == K6_SCRIPT_EXCEPTION, completed.stdout + completed.stderr[-2000:]
    assert "holds 100 records, UPLOAD_COUNT=99" in completed.stderr
