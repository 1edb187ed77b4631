"""The strongest compose check without a Docker engine: each service's compose command and environment
(and its image's), run natively, becomes healthy by its compose health check.
"""

import os
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labrunner import certs as lab_certs

from tests.compose_file import compose
from tests.integration.compose_support import LOOPBACK, image_environment, image_healthcheck, seconds
from tests.support import ROOT, RunningService, launch_service

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# --- The strongest one: each service's compose command and environment, run natively --------


@pytest.fixture(scope="module")
def compose_certs() -> Iterator[Path]:
    """The certs one-shot's command (as a user gets it: no PUBLISH_ADDRESS), run natively into a
    folder that stands in for /certs."""
    certs = compose()["services"]["certs"]
    command = certs["command"]
    assert command == [
        "python", "scripts/gen_certs.py", "--dir", "/certs", "--no-ca-key", "--san", "127.0.0.1"
    ]  # fmt: skip
    assert "certs:/certs" in certs["volumes"]
    with tempfile.TemporaryDirectory(prefix="protolab-certs-") as directory:
        native = [directory if part == "/certs" else part for part in command[1:]]
        subprocess.run([sys.executable, *native], cwd=ROOT, check=True, timeout=60)
        # Every service mounts the volume: it holds the CA's certificate, never its key.
        assert sorted(p.name for p in Path(directory).iterdir()) == ["ca.pem", "server-key.pem", "server.pem"]
        assert lab_certs.problem(Path(directory)) is None
        yield Path(directory)


def _native(env: Mapping[str, str], certs: Path) -> dict[str, str]:
    """Container paths under /certs mapped to the native stand-in folder."""
    return {
        key: str(certs / value.removeprefix("/certs/")) if value.startswith("/certs/") else value
        for key, value in env.items()
    }


def _run_check(test: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    assert test[0] == "CMD" and test[1] == "python", test
    argv = [sys.executable, *test[2:]]
    return subprocess.run(
        argv, check=False, cwd=ROOT, env={**env}, capture_output=True, text=True, timeout=30
    )


NATIVE_CASES = [(name, tls) for name in ("rest-aiohttp", "rest-quart", "grpc-aio") for tls in (False, True)]


@dataclass
class NativeRun:
    """A compose service started natively: its resolved compose entry, native env and process."""

    service: dict[str, Any]
    env: dict[str, str]
    running: RunningService


def _start_native(name: str, tls: bool, certs: Path) -> NativeRun:
    service = compose({"SUT_TLS": "1"} if tls else {})["services"][name]
    command = service["command"]
    assert command[:2] == ["python", "-m"] and command[2].startswith("services."), command
    container_env = {**image_environment(service["build"]), **service["environment"]}
    assert bool(container_env["TLS_CERT_FILE"]) == tls
    # What differs from the container: loopback instead of every interface, ephemeral ports
    # (other tests run services too), one worker, /certs mapped to a local folder.
    native = {**container_env, "HOST": LOOPBACK, "PORT": "0", "METRICS_PORT": "0", "WORKERS": "1"}
    env = _native(native, certs)
    return NativeRun(service, env, launch_service(command[2].removeprefix("services."), env))


@pytest.fixture(scope="module")
def native_runs(compose_certs: Path) -> Iterator[dict[tuple[str, bool], NativeRun | BaseException]]:
    """Every case started at once (start-up is mostly record-pool generation); each test stops its own."""
    with ThreadPoolExecutor(len(NATIVE_CASES)) as pool:
        starts = {case: pool.submit(_start_native, *case, compose_certs) for case in NATIVE_CASES}
    runs = {case: future.exception() or future.result() for case, future in starts.items()}
    yield runs
    for run in runs.values():
        if isinstance(run, NativeRun) and run.running.process.poll() is None:
            run.running.process.kill()
            run.running.process.wait()


@pytest.mark.parametrize(
    ("name", "tls"), NATIVE_CASES, ids=[f"{n}-{'tls' if t else 'plain'}" for n, t in NATIVE_CASES]
)
def test_compose_service_runs_natively_and_becomes_healthy(name: str, tls: bool, native_runs) -> None:
    run = native_runs[(name, tls)]
    if isinstance(run, BaseException):
        raise run
    running, service = run.running, run.service
    try:
        assert running.tls == tls
        check_env = {**os.environ, **run.env, "PORT": str(running.port)}
        for test in (service["healthcheck"]["test"], ["CMD", *image_healthcheck(service["build"])]):
            result = _run_check(test, check_env)
            assert result.returncode == 0, f"{test}: {result.stderr}"
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://{LOOPBACK}:{running.metrics_port}/metrics", timeout=10
        ) as response:
            assert response.status == 200
        # A healthcheck against a port nobody listens on must fail, or the checks above prove nothing.
        dead = _run_check(service["healthcheck"]["test"], {**check_env, "PORT": "1"})
        assert dead.returncode == 1, dead.stderr
    finally:
        exit_code = running.stop(signal.SIGTERM, timeout=seconds(service["stop_grace_period"]))
    assert exit_code == 0
