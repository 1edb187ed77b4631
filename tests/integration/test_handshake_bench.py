"""The TLS handshake benchmark (labrunner.report.handshakes, scripts/handshake_bench.py) against the real
servers: what each server counted is the plan, every figure is positive, the document round-trips; a
server that counts nothing, or a handshake the plan does not hold, is an error. No figure is judged."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from labrunner import certs
from labrunner.report import handshakes
from labrunner.report.handshakes import HandshakeCase, HandshakeMismatch

from tests.support import ROOT

# Servers on ephemeral ports, their own processes, no figure judged: beside other tests, as
# test_tls_handshakes.py (tests/conftest.py). The CPU they measure is their own worker's.
pytestmark = [pytest.mark.timeout(180), pytest.mark.parallel]

ROUNDS, HANDSHAKES = 2, 20


def figures(case: HandshakeCase) -> list[float]:
    """Every figure of a case that must be above zero: the rounds' values, the means, the ratio and its
    interval (a mean's t interval over two rounds may reach below zero: t is 12.7), each interval there
    (two rounds) and around its centre."""
    values = [*case.full_rounds_us, *case.resumed_rounds_us, *case.no_handshake_rounds_us]
    for estimate in (case.full_us, case.resumed_us, case.no_handshake_us):
        assert estimate.low is not None and estimate.high is not None, case
        assert estimate.low <= estimate.value <= estimate.high, case
        values.append(estimate.value)
    ratio = case.resumed_over_full
    assert ratio.low is not None and ratio.high is not None, case
    assert ratio.low <= ratio.value <= ratio.high, case
    return [*values, ratio.value, ratio.low]


def test_the_benchmark_runs_on_its_own_and_the_servers_count_its_plan(tmp_path: Path) -> None:
    out = tmp_path / handshakes.FILE
    arguments = ["--rounds", str(ROUNDS), "--handshakes", str(HANDSHAKES), "--out", str(out)]
    finished = subprocess.run(
        [sys.executable, "scripts/handshake_bench.py", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    document = json.loads(out.read_text())
    cases = handshakes.cases_of(document)
    assert [case.service for case in cases] == list(handshakes.COUNTING)
    planned = handshakes.WARMUP + ROUNDS * HANDSHAKES  # of each kind
    for case in cases:
        assert (case.counted_full, case.counted_resumed, case.client_resumed) == (planned,) * 3, case
        assert (case.rounds, case.handshakes) == (ROUNDS, HANDSHAKES)
        assert case.tls_version == "TLSv1.3"
        assert case.alpn == ("h2" if case.service == "grpc_grpclib" else "http/1.1")
        assert (
            len(case.full_rounds_us) == len(case.resumed_rounds_us) == len(case.no_handshake_rounds_us) == 2
        )
        assert all(value > 0 for value in figures(case)), case
        assert case.idle_us_per_s >= 0 and 0 <= case.others_share <= 1
        if len(os.sched_getaffinity(0)) > 1:
            assert case.server_cpu is not None and case.server_cpu != case.client_cpu
        assert case.service in finished.stdout
    # The file round-trips: its cases read and written again are its cases.
    assert json.loads(json.dumps(handshakes.as_document(cases)))["cases"] == document["cases"]
    assert handshakes.cases_of(json.loads(json.dumps(handshakes.as_document(cases)))) == cases


@pytest.mark.parametrize("service", ["rest_granian", "grpc_aio"])
def test_a_server_that_counts_no_handshakes_is_an_error(service: str) -> None:
    """Granian's TLS (rustls) and grpc.aio's (gRPC core) are not Python's: they have no counter, and the
    benchmark cannot tell its figures are the handshakes it planned."""
    with pytest.raises(HandshakeMismatch, match="not counted"):
        handshakes.run(rounds=1, handshakes=2, services=[service], warmup=1)


def test_a_handshake_the_plan_does_not_hold_is_an_error() -> None:
    """One full handshake made before the benchmark's own: the server counts one more than the plan."""
    certs.ensure_certs()
    with handshakes.serving("rest_aiohttp", None) as server:
        context = handshakes.client_context(server.service, certs.DEFAULT_DIR / certs.CA_FILE)
        handshakes.tls_connection(server.port, context, None)
        worker = handshakes.worker_pid(server)
        with pytest.raises(HandshakeMismatch, match=r"counted 3 full and \d+ resumed after warm-up"):
            handshakes.measure_server(server, rounds=1, handshakes=2, warmup=2)
    assert server.process.returncode is not None
    with pytest.raises(ProcessLookupError):  # its worker too
        os.kill(worker, 0)
