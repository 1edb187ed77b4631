"""Compression with real k6 against the real lab servers: k6/rest.js (aiohttp over HTTP/1.1, Quart on
Hypercorn over HTTP/2 with TLS) and k6/grpc_unary.js (grpc.aio), each with COMPRESSION=identity and
gzip on both sides (the server's env and k6's), a fixed number of calls: every check passes (REST's
'compressed with gzip' too) and k6 receives, per call, under half the bytes over REST and under three
quarters over gRPC (100 records: JSON gzips about 5x, protobuf about 2x). rest.js asking for gzip from a
server that does not compress fails its 'compressed with gzip' check, so its thresholds; a COMPRESSION
it does not know stops it at init."""

import functools
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest

from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.records import load_pool
from tests.e2e.k6_servers import K6_SCRIPT_EXCEPTION, K6_THRESHOLDS_FAILED, load_summary, run_k6
from tests.support import (
    CERTS,
    RunningService,
    fixed_calls,
    k6_env,
    launch_at_once,
    launch_service,
    rest_h2,
    tls_env,
)

# Bytes counted, never a time or a CPU: k6 and the servers answer the same whatever runs beside them.
pytestmark = [pytest.mark.parallel, pytest.mark.timeout(180)]

COUNT, VUS, CALLS = 100, 2, 40
CHECK_EVERY = 2  # half the calls decoded and checked
COMPRESSED = "compressed with gzip"  # rest.js's check under COMPRESSION=gzip
# k6's bytes received per call under gzip, at most this share of identity's.
MOST_SHARE = {"rest.js": 0.5, "grpc_unary.js": 0.75}


class Target(NamedTuple):
    module: str
    script: str
    http2: bool = False  # REST over HTTP/2 with TLS (else HTTP/1.1 cleartext)


TARGETS = {
    "aiohttp-h1": Target("rest_aiohttp", "rest.js"),
    "quart-h2-tls": Target("rest_quart", "rest.js", http2=True),
    "grpc": Target("grpc_aio", "grpc_unary.js"),
}
COMPRESSIONS = ("identity", "gzip")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[tuple[str, str], RunningService]]:
    """Each target's server under each compression, started at once; killed at the end (their stop is
    not under test)."""

    def launch(target: Target, compression: str) -> RunningService:
        return launch_service(
            target.module, {"COMPRESSION": compression, **(tls_env() if target.http2 else {})}
        )

    tls_env()  # generates certs/ when missing, once, before the launches
    started = launch_at_once(
        {
            (name, compression): functools.partial(launch, TARGETS[name], compression)
            for name in TARGETS
            for compression in COMPRESSIONS
        }
    )
    try:
        yield started
    finally:
        for service in started.values():
            service.kill()


class Run(NamedTuple):
    completed: subprocess.CompletedProcess[str]
    metrics: dict[str, Any]  # k6's summary (SUMMARY_FILE)
    checks: Counter[tuple[str, bool]]  # (check, passed): how many, from k6's points

    @property
    def output(self) -> str:
        return self.completed.stdout + self.completed.stderr[-3000:]

    def count(self, metric: str) -> int:
        return int(self.metrics[metric]["values"]["count"]) if metric in self.metrics else 0


def run(target: Target, service: RunningService, directory: Path, compression: str, **extra: str) -> Run:
    """CALLS calls of target's script shared by VUS VUs, COMPRESSION=compression (and `extra`) in k6's
    env."""
    settings = {
        **fixed_calls(CALLS, VUS),
        "COUNT": str(COUNT),
        "CHECK_EVERY": str(CHECK_EVERY),
        "COMPRESSION": compression,
        **extra,
    }
    env = k6_env(service.port, grpc=target.script != "rest.js", **settings)
    if target.http2:
        env = rest_h2(env, f"https://localhost:{service.port}", CERTS / "ca.pem")
    directory.mkdir()
    summary, points = directory / "summary.json", directory / "points.json"
    completed = run_k6(target.script, env, "--out", f"json={points}", summary=summary)
    checks: Counter[tuple[str, bool]] = Counter()
    if points.is_file():
        for line in points.read_text().splitlines():
            point = json.loads(line)
            if point["type"] == "Point" and point["metric"] == "checks":
                checks[point["data"]["tags"]["check"], point["data"]["value"] == 1] += 1
    return Run(completed, load_summary(summary) if summary.is_file() else {}, checks)


def passed_all(run: Run) -> None:
    """k6 exited 0 with every call answered and counted, every check passed, some checked."""
    assert run.completed.returncode == 0, run.output
    assert run.count("protolab_reqs") == CALLS, run.output
    assert run.metrics["protolab_req_failed"]["values"]["rate"] == 0
    assert run.checks and not [check for check, ok in run.checks if not ok], run.checks
    assert run.metrics["checks"]["values"]["fails"] == 0 and run.metrics["checks"]["values"]["passes"] > 0


@pytest.mark.parametrize("name", list(TARGETS))
def test_gzip_on_both_sides_passes_every_check_in_fewer_bytes_a_call(
    servers: dict[tuple[str, str], RunningService], tmp_path: Path, name: str
) -> None:
    target = TARGETS[name]
    runs = {c: run(target, servers[name, c], tmp_path / c, c) for c in COMPRESSIONS}
    for compression, done in runs.items():
        passed_all(done)
        checked = {check for check, _ in done.checks}
        # rest.js checks the compression only under gzip; every decoded response came compressed.
        if target.script == "rest.js" and compression == "gzip":
            assert done.checks[COMPRESSED, True] == done.checks["status is 200", True] > 0, done.checks
        else:
            assert COMPRESSED not in checked, checked
    per_call = {c: runs[c].count("data_received") / runs[c].count("protolab_reqs") for c in COMPRESSIONS}
    share = per_call["gzip"] / per_call["identity"]
    # A call's reply alone is over 7 kB as it is (JSON about 18 kB): k6 counted what it read.
    assert per_call["identity"] > 7000, per_call
    assert share < MOST_SHARE[target.script], (share, per_call)


def test_rest_asking_gzip_of_a_server_that_does_not_compress_fails_its_check(
    servers: dict[tuple[str, str], RunningService], tmp_path: Path
) -> None:
    target = TARGETS["aiohttp-h1"]
    done = run(target, servers["aiohttp-h1", "identity"], tmp_path / "mismatch", "gzip")
    assert done.completed.returncode == K6_THRESHOLDS_FAILED, done.output
    assert "thresholds on metrics 'checks, protolab_req_failed' have been crossed" in done.completed.stderr
    # Every decoded response failed the compression check, and only that one: its records were there.
    failed = {check for check, ok in done.checks if not ok}
    assert failed == {COMPRESSED}, done.checks
    assert done.checks[COMPRESSED, False] == done.checks["record count == COUNT", True] > 0, done.checks
    assert done.checks[COMPRESSED, True] == 0, done.checks


def test_rest_refuses_a_compression_it_does_not_know_at_init(
    servers: dict[tuple[str, str], RunningService], tmp_path: Path
) -> None:
    done = run(TARGETS["aiohttp-h1"], servers["aiohttp-h1", "identity"], tmp_path / "br", "br")
    assert done.completed.returncode == K6_SCRIPT_EXCEPTION, done.output
    assert "protolab: COMPRESSION=br, want one of identity, gzip" in done.completed.stderr, done.output
    assert not done.checks and done.count("http_reqs") == 0, done.output


def test_an_upload_under_gzip_keeps_its_content_type_and_is_accepted(
    servers: dict[tuple[str, str], RunningService], tmp_path: Path
) -> None:
    """rest.js adds Accept-Encoding to an upload's own headers (it once replaced its Content-Type: 415)."""
    body = tmp_path / "upload.json"
    body.write_bytes(orjson.dumps({"records": load_pool(DEFAULT_POOL_SIZE, DEFAULT_SEED)[:COUNT]}))
    target = TARGETS["aiohttp-h1"]
    result = run(target, servers[("aiohttp-h1", "gzip")], tmp_path / "k6", "gzip", UPLOAD_FILE=str(body))
    passed_all(result)
