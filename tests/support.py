"""What the tests share: the repository's paths, the lab's targets, services started on ephemeral ports."""

import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

from labrunner.backends.base import SERVICE_STOP_ENV, Endpoint, ServiceHandle
from labrunner.model.matrix import expand, parse_matrix
from labrunner.model.scenario import Plan, Scenario
from labrunner.results.store import scenario_dict

from services.common.config import DEFAULT_PORTS
from services.common.stacks import STACKS

ROOT = Path(__file__).resolve().parents[1]
# The services the tests start keep their prometheus_client files under one directory of this pytest
# process, made when the first service starts and removed when pytest ends (tests/conftest.py): a
# service a test kills outright cannot remove its own, and thousands were left in the temp directory.
# Made lazily: the helper processes that import this module start no service, and never remove it.
# Made under a lock: a fixture starting services from threads at once (test_compose_native.py) made
# one root per thread, and only the first is removed (an empty root, left twice by clean-clone checks).
_SERVICE_METRICS_ROOT: list[Path] = []
_SERVICE_METRICS_ROOT_LOCK = threading.Lock()


def service_metrics_root() -> Path | None:
    """The directory of this process's services' metrics directories; None before a service started."""
    return _SERVICE_METRICS_ROOT[0] if _SERVICE_METRICS_ROOT else None


def _service_metrics_dir() -> str:
    with _SERVICE_METRICS_ROOT_LOCK:
        if not _SERVICE_METRICS_ROOT:
            # Named by the pytest process (and xdist worker) that owns it: a root left behind says whose.
            owner = f"{os.getpid()}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
            _SERVICE_METRICS_ROOT.append(Path(tempfile.mkdtemp(prefix=f"protolab-test-metrics-{owner}-")))
    return tempfile.mkdtemp(dir=_SERVICE_METRICS_ROOT[0])


# The lab's own runs calibrate with 5 rounds instead of 40 (run_matrix.py --calibration-rounds):
# about 0.3 s instead of 2.5 s, before and after each of the ~50 runs of the tests. One interrupt
# moment keeps the default (test_interrupt_moments.py).
# Quick calibrations, taken once even on a busy host (the docker tests run beside the parallel phase,
# where every calibration found the host busy and waited 5 s, twice: 24 waits in one docker phase).
QUICK_CALIBRATION = ("--calibration-rounds", "5", "--calibration-attempts", "1")


def run_matrix_command(*args: str) -> list[str]:
    """scripts/run_matrix.py with args, calibrating quickly (QUICK_CALIBRATION), run from ROOT."""
    return [sys.executable, "scripts/run_matrix.py", *QUICK_CALIBRATION, *args]


CERTS = ROOT / "certs"
# matrix.toml's instrumented targets of the default and ci presets, in its order: what the lab
# must offer, written out so a target dropped from the matrix fails the tests.
ALL_TARGETS = (
    "aiohttp-h1",
    "aiohttp-h1-tls",
    "quart-h1",
    "quart-h1-tls",
    "quart-h2-tls",
    "grpc",
    "grpc-tls",
    "grpc-stream",
)
# The second implementations at equal protocol, next in matrix.toml (preset implementations).
IMPLEMENTATION_TARGETS = ("granian-h1", "granian-h1-tls", "granian-h2-tls", "grpclib", "grpclib-tls")
# The floor servers (benchmarks/floor/, preset floor), in matrix.toml's order: the targets running a
# declared stack's floor module. Which stacks there are is services/common/stacks.py's; that each has
# its floor target is tests/unit/test_stacks.py's check, what the targets are the tests' own.
FLOOR_TARGETS = tuple(
    name
    for name, table in tomllib.loads((ROOT / "matrix.toml").read_text())["targets"].items()
    if table.get("module") in {stack.floor_module for stack in STACKS}
)
# Each stack's lab target, the one its floor target copies (floor-<lab target>): one per stack.
LAB_TARGETS = tuple(name.removeprefix("floor-") for name in FLOOR_TARGETS)
# A preset whose first scenario's service drains 3 s on its stop, so the next scenario starts while
# it finishes: a window wide enough to interrupt from outside, timed from the progress lines.
SLOW_STOP_TARGETS = """
[targets.aiohttp-slow-stop]
service = "rest_aiohttp"
script = "k6/rest.js"
protocol = "http1.1"
tls = false
expect_proto = "HTTP/1.1"
env = { SHUTDOWN_DRAIN_SECONDS = "3" }

# Scenarios follow the targets' order in the file (with --seed slow_stop_seed()): this one runs after
# the slow stop.
[targets.grpc-after-slow-stop]
service = "grpc_aio"
script = "k6/grpc_unary.js"
protocol = "grpc"
tls = false

[presets.slow-stop]
targets = ["aiohttp-slow-stop", "grpc-after-slow-stop"]
profiles = ["small"]
duration = "1s"
warmup = "0"
"""
SLOW = "aiohttp-slow-stop.small.c100.closed.r1"
AFTER_SLOW = "grpc-after-slow-stop.small.c100.closed.r1"


def seed_keeping_matrix_order(plan: Plan) -> str:
    """A --seed under which the plan runs in the matrix's order: for the tests that interrupt a run at a
    scenario they name by that order (the first, the second)."""
    keeping = (seed for seed in itertools.count() if replace(plan, seed=seed).run_order == plan.scenarios)
    return str(next(keeping))


def slow_stop_seed() -> str:
    """seed_keeping_matrix_order of the slow-stop preset: the slow stop first, then the one after it."""
    matrix = ROOT / "matrix.toml"
    parsed = parse_matrix(tomllib.loads(matrix.read_text() + SLOW_STOP_TARGETS), matrix)
    return seed_keeping_matrix_order(expand(parsed, "local", "slow-stop"))


# Every server implementation, by protocol, from the one table of services: a server added
# there is covered by every test parametrized over these.
REST_SERVERS = tuple(service for service in DEFAULT_PORTS if service.startswith("rest_"))
GRPC_SERVERS = tuple(service for service in DEFAULT_PORTS if service.startswith("grpc_"))


@dataclass
class RunningService:
    """A service process and the ports it printed in its listening line (`listening`: the whole line)."""

    process: subprocess.Popen[str]
    port: int
    metrics_port: int
    workers: int
    tls: bool
    listening: dict[str, Any] = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self) -> int:
        return _kill_group(self.process)


def _kill_group(process: subprocess.Popen[str]) -> int:
    """SIGKILL the service's process group: killing the supervisor alone would orphan its workers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def child_pids(pid: int) -> list[int]:
    """The process ids of `pid`'s children (a service supervisor's workers)."""
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def free_ports(count: int) -> list[int]:
    """count distinct free loopback ports: every socket stays bound until all are chosen, so
    the kernel cannot hand out one port twice (as separate bind-and-close calls may)."""
    with contextlib.ExitStack() as bound:
        sockets = [bound.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def k6_env(port: int, grpc: bool, **settings: str) -> dict[str, str]:
    """Env for the lab's k6 scripts against a cleartext service on 127.0.0.1 (REST over HTTP/1.1)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "K6_NO_USAGE_REPORT": "true",
        **settings,
    }
    if grpc:
        return env | {"GRPC_ADDR": f"127.0.0.1:{port}", "PROTO_DIR": str(ROOT / "proto")}
    return env | {
        "BASE_URL": f"http://127.0.0.1:{port}",
        "EXPECT_PROTO": "HTTP/1.1",
        "GODEBUG": "http2client=0",
    }


def rest_h2(env: dict[str, str], base_url: str, ca: Path) -> dict[str, str]:
    """k6_env's for rest.js as the runner runs an HTTP/2 target: TLS, the CA, h2 offered by ALPN."""
    env = dict(env)
    del env["GODEBUG"]
    return env | {"BASE_URL": base_url, "EXPECT_PROTO": "HTTP/2.0", "TLS": "1", "SSL_CERT_FILE": str(ca)}


def fixed_calls(calls: int, vus: int) -> dict[str, str]:
    """k6's load model for exactly `calls` calls shared by `vus` VUs (shared-iterations; DURATION only
    caps it): the counts a test judges, never a race with a duration's end."""
    return {"LOAD_MODEL": "shared-iterations", "ITERATIONS": str(calls), "VUS": str(vus), "DURATION": "60s"}


def stream_end_lost(script: str) -> int:
    """How many of a shared-iterations run's streams may end unrecorded by k6: k6 once ended its last
    iteration before the stream's 'end' event ran (19 of 20 recorded, none failed, on a busy host). The
    server handled that call; k6 never counted it. At most one, and only for k6/grpc_stream.js."""
    return 1 if script == "grpc_stream.js" else 0


def tls_env() -> dict[str, str]:
    """Env enabling TLS with the lab certificates (generated by scripts/gen_certs.py)."""
    if not (CERTS / "server.pem").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_certs.py")], check=True, cwd=ROOT)
    return {"TLS_CERT_FILE": str(CERTS / "server.pem"), "TLS_KEY_FILE": str(CERTS / "server-key.pem")}


K = TypeVar("K")


def launch_at_once(launches: Mapping[K, Callable[[], RunningService]]) -> dict[K, RunningService]:
    """Every launch (a launch_service call) at once, each in a thread; when any failed, the others are
    killed and the first failure raised."""
    with ThreadPoolExecutor(len(launches)) as executor:
        futures = {key: executor.submit(launch) for key, launch in launches.items()}
    started = {key: future.result() for key, future in futures.items() if future.exception() is None}
    if failed := [error for future in futures.values() if (error := future.exception()) is not None]:
        for service in started.values():
            service.kill()
        raise failed[0]
    return started


def launch_service(
    module: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    preexec_fn: Callable[[], None] | None = None,
    package: str = "services",
    stderr: IO[str] | None = None,
) -> RunningService:
    """Start `python -m <package>.<module>` on ports 0 and wait for its listening line.

    preexec_fn runs in the child before exec (e.g. to join a cgroup); package "benchmarks.floor"
    starts a floor server; stderr, a file for its log (default: the test's own stderr).
    """
    full_env = {
        **os.environ,
        "PORT": "0",
        "METRICS_PORT": "0",
        "WORKERS": "1",
        # No drain and a 1 s grace, as the runner starts its services: a stop after the clients have
        # gone sometimes waited the whole grace, and at the services' 10 s that was 11 s more in
        # dozens of teardowns. A test of the drain or the grace period sets its own.
        **SERVICE_STOP_ENV,
        "RECORD_POOL_SIZE": "2000",
        **(env or {}),
    }
    full_env.setdefault("PROMETHEUS_MULTIPROC_DIR", _service_metrics_dir())
    process = subprocess.Popen(
        [sys.executable, "-m", f"{package}.{module}"],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        # Unsafe with threads only for callables that take locks; tests pass one os-level write.
        preexec_fn=preexec_fn,  # noqa: PLW1509
        start_new_session=True,  # its own process group, so _kill_group reaches the forked workers
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            if event.get("event") == "listening":
                return RunningService(
                    process, event["port"], event["metrics_port"], event["workers"], event["tls"], event
                )
        elif process.poll() is not None:
            break
    raise AssertionError(f"{package}.{module} did not print its listening line (exit {_kill_group(process)})")


def ok_result(
    scenario: Scenario,
    *,
    requests: int,
    rps: float,
    latency_ms: Mapping[str, float],
    received_bytes: int,
    window_s: float,
    cpu_seconds: float,
    quota_used: float,
    **metrics: Any,
) -> dict[str, Any]:
    """A successful result with the real scenario section: the parts the report, the summaries and
    the findings read. metrics: more k6 metrics (error_rate, dropped_iterations)."""
    return {
        "scenario_id": scenario.id,
        "status": "ok",
        "scenario": scenario_dict(scenario),
        "k6": {
            "cpu_utilisation": 0.3,
            "metrics": {
                "requests": requests,
                "requests_per_second": rps,
                "errors": 0,
                "latency_ms": dict(latency_ms),
                "data_received_bytes": received_bytes,
                "test_run_seconds": window_s,
                **metrics,
            },
        },
        "service": {"usage": {"cpu_seconds": cpu_seconds, "cpu_utilisation": quota_used}},
        "suspect": [],
    }


def latency_from_p50(p50: float) -> dict[str, float]:
    """A latency spread around a p50, in ms: avg = p50, p99 = twice it."""
    return {"avg": p50, "p50": p50, "p90": p50 * 1.5, "p95": p50 * 1.8, "p99": p50 * 2}


def service_handle(scenario: Scenario, service: RunningService) -> ServiceHandle:
    """A handle on a service a test started (launch_service) on this host, as a backend would give the
    runner's verification (run/service_checks.verify)."""
    address = Endpoint("127.0.0.1", service.port)
    return ServiceHandle(
        scenario_id=scenario.id,
        service=scenario.target.service,
        address=address,
        k6_address=address,
        metrics_address=Endpoint("127.0.0.1", service.metrics_port),
        prometheus_target=None,
        workers=1,
        limits="none",
        service_cpus=(),
        k6_cpus=(),
    )
