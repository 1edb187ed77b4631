"""The Python driver (scripts/drive_http.py) against the real Quart on Hypercorn serving HTTP/1.1, HTTP/2
and HTTP/3 (HTTP3=1): each protocol's run writes a summary the runner parses as k6's, with every request
carried by the protocol asked for; a wrong protocol or a missing listener fails before any load, with
k6's exit code for a setup error and a line saying why; the lab's verification proves HTTP/3 was
negotiated and that its records are the pool's."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import DRIVER_SCRIPT
from labrunner.run import connections
from labrunner.run.drive.main import EXIT_BAD_SETUP
from labrunner.run.k6.output import parse_summary, read_summary, take_latency_samples
from labrunner.run.k6_stats import trend_stats
from labrunner.run.service_checks import verify

from tests.support import CERTS, ROOT, RunningService, free_ports, launch_service, service_handle, tls_env

# Real sockets on 127.0.0.1, a second of load each; no figure judged.
pytestmark = pytest.mark.parallel
DRIVER = ROOT / DRIVER_SCRIPT
VUS = 3


@pytest.fixture(scope="module")
def quart() -> Iterator[RunningService]:
    """Quart on Hypercorn offering h2 and HTTP/1.1 over TLS, and HTTP/3 on UDP at the same port."""
    service = launch_service("rest_quart", {**tls_env(), "HTTP3": "1", "WORKERS": "1"})
    try:
        yield service
    finally:
        service.kill()


def drive(
    port: int, protocol: str, tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One second of the driver's closed model on `protocol`; its process and its summary file."""
    summary = tmp_path / "summary.json"
    settings = {
        "BASE_URL": f"https://127.0.0.1:{port}",
        "EXPECT_PROTO": protocol,
        "SSL_CERT_FILE": str(CERTS / "ca.pem"),
        "VUS": str(VUS),
        "DURATION": "1s",
        "COUNT": "20",
        "SUMMARY_FILE": str(summary),
        **env,
    }
    args = ["--summary-trend-stats", ",".join(trend_stats()), "--out", f"csv={tmp_path / 'raw.csv'}"]
    done = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, summary


def test_the_listening_line_says_http3(quart: RunningService) -> None:
    assert quart.listening["http3"] is True


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/2.0", "HTTP/3"])
def test_each_protocol_is_driven_and_summarized_as_k6_would(
    quart: RunningService, protocol: str, tmp_path: Path
) -> None:
    done, summary_file = drive(quart.port, protocol, tmp_path)
    assert done.returncode == 0, done.stderr
    summary = read_summary(summary_file)
    assert summary is not None
    metrics = parse_summary(summary)
    assert metrics.requests > VUS and metrics.errors == 0 and metrics.attempts == metrics.requests
    assert metrics.checks_failed == 0 and metrics.checks_passed >= 2 * VUS  # each VU's first reply decoded
    assert metrics.latency_metric == "drive_req_duration" and metrics.latency_count == metrics.requests
    assert metrics.latency_quantiles_ms  # every percentile of the grid, as k6's summary has them
    assert metrics.vus_max == VUS and metrics.connections_opened == VUS and metrics.failed_thresholds == ()
    assert metrics.data_received_bytes > metrics.requests * 1000  # 20 records a reply
    assert len(take_latency_samples(tmp_path / "raw.csv", metrics.latency_metric)) == metrics.requests
    assert "thresholds=ok" in done.stdout


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/3"])
def test_the_open_model_starts_requests_at_the_rate_and_grows_its_pool_to_max_vus(
    quart: RunningService, protocol: str, tmp_path: Path
) -> None:
    model = {"LOAD_MODEL": "constant-arrival-rate", "RATE": "40", "PRE_ALLOCATED_VUS": "1", "MAX_VUS": "4"}
    done, summary_file = drive(quart.port, protocol, tmp_path, **model)
    assert done.returncode == 0, done.stderr
    summary = read_summary(summary_file)
    assert summary is not None
    metrics = parse_summary(summary)
    # 40 starts in the second, each run or dropped: none lost, none made up.
    assert metrics.iterations + metrics.dropped_iterations == 40
    assert metrics.errors == 0 and metrics.requests == metrics.iterations
    assert 1 <= metrics.connections_opened <= 4 and metrics.vus_max == metrics.connections_opened


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/2.0", "HTTP/3"])
def test_churn_opens_a_new_connection_every_n_requests_as_the_runner_checks(
    quart: RunningService, protocol: str, tmp_path: Path
) -> None:
    done, summary_file = drive(quart.port, protocol, tmp_path, CHURN="4")
    assert done.returncode == 0, done.stderr
    summary = read_summary(summary_file)
    assert summary is not None
    metrics = parse_summary(summary)
    assert metrics.errors == 0 and metrics.requests > 4 * VUS and metrics.vus_max == VUS
    connections.check_churn(4, metrics.attempts, metrics.connections_opened, metrics.vus_max or 0)
    assert metrics.connections_opened > VUS


def test_h2_asked_of_a_server_offering_only_http1_fails_before_any_load(tmp_path: Path) -> None:
    service = launch_service("rest_quart", {**tls_env(), "ALPN_PROTOCOLS": "http/1.1", "WORKERS": "1"})
    try:
        done, summary = drive(service.port, "HTTP/2.0", tmp_path)
    finally:
        service.kill()
    assert done.returncode == EXIT_BAD_SETUP
    assert "negotiated ALPN None, not h2" in done.stderr  # it offers h2 alone: the server picks none
    assert not summary.exists()


# No server there: TCP is refused at once, QUIC gets no answer and waits out the connect timeout (10 s).
@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/2.0", "HTTP/3"])
def test_no_server_is_one_line_that_says_why_and_no_leftovers(protocol: str, tmp_path: Path) -> None:
    [port] = free_ports(1)
    done, summary = drive(port, protocol, tmp_path)
    assert done.returncode == EXIT_BAD_SETUP
    # What asyncio and aiohttp log of a future or a session left behind ("Future exception was never
    # retrieved", "Unclosed client session") would be more lines than the one.
    [line] = done.stderr.splitlines()
    assert line.startswith(f"drive_http: could not connect {VUS} VUs to https://127.0.0.1:{port}: "), line
    assert not line.endswith(": "), "an error without a message says nothing"
    assert not summary.exists()


def test_unsupported_settings_are_refused_by_name(quart: RunningService, tmp_path: Path) -> None:
    done, summary = drive(quart.port, "HTTP/3", tmp_path, COMPRESSION="gzip")
    assert done.returncode == EXIT_BAD_SETUP
    assert "COMPRESSION is set: the Python driver does not run compression" in done.stderr
    assert not summary.exists()


def test_verification_proves_http3_and_the_pool_records(quart: RunningService) -> None:
    plan = expand(load_matrix(ROOT / "matrix.toml"), "local", "http3")
    scenario = next(s for s in plan.scenarios if s.target.name == "quart-h3")
    verification = verify(service_handle(scenario, quart), scenario, CERTS / "ca.pem")
    assert verification.ok, verification.failures
    assert verification.protocol == "HTTP/3"
    assert any("the pool's records" in check for check in verification.checks)
