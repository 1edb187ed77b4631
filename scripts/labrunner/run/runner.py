"""Run a plan: each scenario through start, health, verify, warm-up, measure, stop, collect."""

import json
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner import certs
from labrunner.backends.base import (
    Backend,
    BackendSettings,
    K6Invocation,
    ScenarioFailed,
    ServiceHandle,
    ServiceUsage,
)
from labrunner.model.scenario import LoadModel, Plan, Scenario
from labrunner.observe import annotations, interference, prometheus_sd
from labrunner.results.store import (
    Outcome,
    build_manifest,
    build_result,
    completed_ok,
    result_path,
    write_json_atomic,
    write_summaries,
)
from labrunner.run import calibration, capacity, k6, service_checks
from labrunner.run.k6 import K6Run
from labrunner.say import Say

OVERHEAD_PHASES = ("start", "health", "verify", "scrape", "stop", "collect")
ASSUMED_OVERHEAD_S = 5.0  # per scenario, for the ETA until one has been measured


@dataclass(frozen=True)
class RunConfig:
    """Run-wide choices from the command line."""

    run_id: str
    out_dir: Path
    targets_dir: Path | None  # Prometheus file_sd directory; None = do not write
    influxdb_url: str | None
    prometheus_url: str | None  # waited on until it scrapes each service; None = do not wait
    resume: bool
    argv: tuple[str, ...]
    backend_reason: str
    provenance: dict[str, Any]  # git, versions, host (see labrunner.provenance)


def run_plan(plan: Plan, config: RunConfig, backend: Backend, settings: BackendSettings, say: Say) -> bool:
    """Run every scenario not already done; True when all of them succeeded."""
    out = config.out_dir
    order = [s.id for s in plan.scenarios]
    done = completed_ok(out) if config.resume else set()
    started_at, resumed = _sessions(out / "manifest.json", config.resume)
    manifest_args: dict[str, Any] = {
        "run_id": config.run_id,
        "plan": plan,
        "backend": {"name": backend.name, "reason": config.backend_reason},
        "provenance": config.provenance,
        "argv": config.argv,
        "started_at": started_at,
        "resumed_at": resumed,
        "settings": {
            "out_dir": str(out),
            "influxdb_url": config.influxdb_url,
            "prometheus_targets_dir": str(config.targets_dir) if config.targets_dir else None,
        },
    }
    # The same fixed workload before the first scenario and after the last, where the first
    # scenario's service runs: how fast this host's CPU was, and whether that changed.
    calibration_cpus = calibration.cpus_for(plan.scenarios[0]) if plan.scenarios else ()
    calibrations: dict[str, Any] = {}
    if plan.scenarios:
        calibrations["before"] = calibration.calibrate(calibration_cpus, "before", say)
    manifest_args["calibration"] = calibrations
    write_json_atomic(
        out / "manifest.json", build_manifest(**manifest_args, finished_at=None, complete=False, all_ok=None)
    )
    progress = _Progress(plan.scenarios, done, say)
    failed: list[str] = []
    interrupted = True
    try:
        for index, scenario in enumerate(plan.scenarios, start=1):
            if scenario.id in done:
                say(f"[{index}/{len(plan.scenarios)}] {scenario.id}: ok in an earlier session, skipped")
                continue
            progress.starting(index, scenario)
            result = _run_scenario(scenario, config, backend, settings, say)
            write_json_atomic(result_path(out, scenario.id), result)
            write_summaries(out, config.run_id, order)
            progress.finished(index, scenario, result)
            if result["status"] != "ok":
                failed.append(scenario.id)
        if plan.scenarios:
            calibrations["after"] = calibration.calibrate(calibration_cpus, "after", say)
        interrupted = False
    finally:
        backend.close()
        if config.targets_dir is not None:
            prometheus_sd.delete_run(config.targets_dir, config.run_id)
        all_ok = not interrupted and not failed
        write_json_atomic(
            out / "manifest.json",
            build_manifest(
                **manifest_args,
                finished_at=datetime.now(UTC),
                complete=not interrupted,
                all_ok=all_ok if not interrupted else None,
            ),
        )
        write_summaries(out, config.run_id, order)  # CPU per request in the final calibration's units
    say(
        f"{len(plan.scenarios) - len(failed)} of {len(plan.scenarios)} scenarios ok"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nresults: {out}/summary.md"
    )
    return not failed


def _sessions(manifest: Path, resume: bool) -> tuple[datetime, list[str]]:
    """When the run started and when it was resumed: a resumed run keeps its first start."""
    now = datetime.now(UTC)
    if not resume:
        return now, []
    try:
        previous = json.loads(manifest.read_text())
        return datetime.fromisoformat(previous["started_at"]), [*previous["resumed_at"], now.isoformat()]
    except (OSError, ValueError, KeyError):
        return now, [now.isoformat()]


def _run_scenario(
    scenario: Scenario, config: RunConfig, backend: Backend, settings: BackendSettings, say: Say
) -> dict[str, Any]:
    timings: dict[str, float] = {}
    handle: ServiceHandle | None = None
    verification: service_checks.Verification | None = None
    k6_run: K6Run | None = None
    search: capacity.Outcome | None = None
    usage: ServiceUsage | None = None
    failure: ScenarioFailed | None = None
    started_at = datetime.now(UTC)
    began = time.monotonic()
    ca_file = settings.certs_dir / certs.CA_FILE
    # /proc/stat around every measured k6 run: what others took on the scenario's CPUs.
    unmetered = interference.unavailable(backend)
    metered = interference.MeteredBackend(backend, interference.read_snapshot if unmetered is None else None)
    try:
        with _timed(timings, "start"):
            handle = backend.start_service(scenario)
        for note in handle.notes:
            say(f"    note: {note}")
        with _timed(timings, "health"):
            service_checks.wait_healthy(backend, handle, scenario.target, ca_file, settings.start_timeout_s)
            if config.targets_dir is not None:
                prometheus_sd.write(config.targets_dir, config.run_id, scenario, handle)
        with _timed(timings, "verify"):
            verification = service_checks.verify(handle, scenario, ca_file)
        if not verification.ok:
            raise ScenarioFailed("verify", "; ".join(verification.failures))
        # k6 split into instances, one CPU of the k6 side each (k6_instances; "auto" resolves here).
        instances = k6.instances_for(scenario.k6_instances, handle.k6_cpus, scenario.load_model)
        if instances > 1:
            places = handle.k6_places[:instances] or [f"CPU {c}" for c in handle.k6_cpus[:instances]]
            say(f"    k6: {instances} instances by execution segments, one each on {', '.join(places)}")
        invocation = _invocation_factory(scenario, config, settings, handle, instances)
        if scenario.warmup_s > 0:
            with _timed(timings, "warmup"):
                warmup = k6.run(backend, handle, invocation(True), measured=False)
            _check_warmup(warmup)
        if config.prometheus_url is not None and config.targets_dir is not None:
            with _timed(timings, "scrape"):
                problem = prometheus_sd.wait_scraped(config.prometheus_url, config.run_id, scenario)
            if problem:
                say(f"    note: {problem}")
        with _timed(timings, "measure"), _marked_window(config, scenario, say):
            if scenario.load_model.search is not None:
                search = capacity.search(scenario, handle, metered, invocation, say)
                k6_run = search.run  # the search checked every step
            else:
                k6_run = k6.run(metered, handle, invocation(False), measured=True)
                _check_measured(k6_run)
    except ScenarioFailed as exc:
        failure = exc
    except Exception as exc:  # a bug or an OS error in one scenario must not end the run
        failure = ScenarioFailed("internal", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        if handle is not None:
            with _timed(timings, "stop"):
                if config.targets_dir is not None:
                    sd_file = prometheus_sd.file_for(config.targets_dir, config.run_id, scenario)
                    sd_file.unlink(missing_ok=True)
                try:
                    usage = backend.stop_service(handle)
                except Exception as exc:  # e.g. a cgroup that would not drain: record, go on
                    message = f"{type(exc).__name__}: {exc}"
                    failure = failure or ScenarioFailed("stop", message, traceback.format_exc())
    with _timed(timings, "collect"):
        outcome = Outcome(
            run_id=config.run_id,
            backend=backend.name,
            scenario=scenario,
            started_at=started_at,
            finished_at=datetime.now(UTC),
            failure=failure,
            handle=handle,
            verification=verification,
            k6_run=k6_run,
            usage=usage,
            timings_s=timings,
            host=interference.scenario_section(metered.window, handle, usage, unmetered),
        )
        result = build_result(outcome)
        if metered.relay_cpu_seconds is not None:  # the userspace link emulator, on k6's CPUs
            result["network"]["relay_cpu_s"] = round(metered.relay_cpu_seconds, 4)
        if search is not None:
            result["capacity"] = search.as_dict()
            result["suspect"] += search.suspect
    timings["overhead"] = sum(timings.get(phase, 0.0) for phase in OVERHEAD_PHASES)
    timings["total"] = time.monotonic() - began
    result["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return result


def _invocation_factory(
    scenario: Scenario,
    config: RunConfig,
    settings: BackendSettings,
    handle: ServiceHandle,
    instances: int = 1,
) -> Callable[..., K6Invocation]:
    def invocation(warmup: bool, model: LoadModel | None = None, step: int | None = None) -> K6Invocation:
        """model and step: one step of a capacity search, with its own summary file."""
        phase = "warmup" if warmup else "measure" if step is None else f"step{step}"
        return k6.build_invocation(
            scenario if model is None else replace(scenario, load_model=model),
            handle,
            run_id=config.run_id,
            root=settings.root,
            ca_file=settings.certs_dir / certs.CA_FILE,
            summary_file=config.out_dir / "k6" / f"{scenario.id}.{phase}.json",
            log_file=settings.logs_dir / f"{scenario.id}.k6.log",
            influxdb_url=config.influxdb_url,
            warmup=warmup,
            instances=instances,
            k6_cpus=handle.k6_cpus,
        )

    (config.out_dir / "k6").mkdir(parents=True, exist_ok=True)
    return invocation


def _check_warmup(run: K6Run) -> None:
    # Thresholds may fail while caches and connections warm up; anything else is fatal.
    if run.exit_code not in (0, k6.EXIT_THRESHOLDS_CROSSED):
        raise ScenarioFailed("warmup", f"k6 exited with code {run.exit_code}", run.output_tail)


def _check_measured(run: K6Run) -> None:
    metrics = run.metrics
    if metrics is None:
        raise ScenarioFailed(
            "measure", f"k6 exited with code {run.exit_code} without a summary", run.output_tail
        )
    if run.exit_code == k6.EXIT_THRESHOLDS_CROSSED:
        rate = f"{metrics.error_rate:.2%}" if metrics.error_rate is not None else "n/a"
        raise ScenarioFailed(
            "measure",
            f"thresholds crossed ({', '.join(metrics.failed_thresholds)}): error rate {rate}, "
            f"{metrics.checks_failed} of {metrics.checks_passed + metrics.checks_failed} checks failed",
            run.output_tail,
        )
    if run.exit_code != 0:
        raise ScenarioFailed("measure", f"k6 exited with code {run.exit_code}", run.output_tail)
    if metrics.requests == 0:
        raise ScenarioFailed("measure", "no successful requests", run.output_tail)


@contextmanager
def _marked_window(config: RunConfig, scenario: Scenario, say: Say) -> Iterator[None]:
    """Mark the measured window in InfluxDB for Grafana's annotations; a failed mark is only a note."""
    if config.influxdb_url is None:
        yield
        return
    _mark(config.influxdb_url, config.run_id, scenario, "start", say)
    try:
        yield
    finally:
        _mark(config.influxdb_url, config.run_id, scenario, "end", say)


def _mark(influxdb_url: str, run_id: str, scenario: Scenario, event: str, say: Say) -> None:
    problem = annotations.mark(influxdb_url, run_id, scenario, event)
    if problem:
        say(f"    note: {problem}")


@contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    began = time.monotonic()
    try:
        yield
    finally:
        timings[phase] = time.monotonic() - began


class _Progress:
    """Progress lines with elapsed time and an ETA from the overhead measured so far."""

    def __init__(self, scenarios: tuple[Scenario, ...], done: set[str], say: Say) -> None:
        self._pending = [s for s in scenarios if s.id not in done]
        self._total = len(scenarios)
        self._began = time.monotonic()
        self._overheads: list[float] = []
        self._say = say

    def starting(self, index: int, scenario: Scenario) -> None:
        overhead = sum(self._overheads) / len(self._overheads) if self._overheads else ASSUMED_OVERHEAD_S
        eta = sum(s.warmup_s + s.measured_seconds + overhead for s in self._pending)
        self._say(
            f"[{index}/{self._total}] {scenario.id}: starting "
            f"(elapsed {_clock(time.monotonic() - self._began)}, ETA {_clock(eta)})"
        )

    def finished(self, index: int, scenario: Scenario, result: dict[str, Any]) -> None:
        self._pending.remove(scenario)
        timings = result["timings_s"]
        self._overheads.append(timings["total"] - timings.get("warmup", 0.0) - timings.get("measure", 0.0))
        self._say(f"[{index}/{self._total}] {scenario.id}: {_outcome_line(result)}")


def _outcome_line(result: dict[str, Any]) -> str:
    timings = result["timings_s"]
    took = f"({timings['total']:.1f}s, overhead {timings['overhead']:.1f}s)"
    if result["status"] != "ok":
        failure = result["failure"]
        detail = f"\n    {failure['log_tail'].strip()[-2000:]}" if failure["log_tail"].strip() else ""
        return f"FAILED in {failure['phase']}: {failure['message']} {took}{detail}"
    metrics = result["k6"]["metrics"]
    usage = (result["service"] or {}).get("usage") or {}
    parts = [
        f"ok {metrics['requests_per_second']:.1f} req/s",
        f"p99 {metrics['latency_ms']['p99']:.2f} ms",
        f"errors {metrics['errors']}",
    ]
    if usage.get("cpu_utilisation") is not None:
        parts.append(f"service CPU {usage['cpu_utilisation']:.0%} of {usage['cpu_limit_cores']:g}")
    if result["k6"]["cpu_utilisation"] is not None:
        parts.append(f"k6 CPU {result['k6']['cpu_utilisation']:.0%}")
    parts.append(interference.describe(result.get("host")))
    parts += [f"suspect: {reason}" for reason in result["suspect"]]
    return ", ".join(parts) + f" {took}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
