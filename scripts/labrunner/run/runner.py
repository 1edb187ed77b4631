"""Run one scenario: start, health, verify, warm-up, measure, stop, collect; nothing is written here."""

import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from labrunner import certs
from labrunner.backends.base import (
    Backend,
    BackendSettings,
    K6Invocation,
    ScenarioFailed,
    ServiceHandle,
    ServiceUsage,
)
from labrunner.model.scenario import LoadModel, Scenario
from labrunner.observe import annotations, interference, prometheus_sd
from labrunner.run import capacity, k6, live, service_checks
from labrunner.run.k6 import K6Run
from labrunner.run.outcome import ScenarioOutcome
from labrunner.say import Say
from services.common.metrics import FLUSH_SECONDS

OVERHEAD_PHASES = ("start", "health", "verify", "scrape", "stop", "collect")
_SCRAPE_INTERVAL_S = 2.0  # prometheus/prometheus.yml


@dataclass(frozen=True)
class RunConfig:
    """What every scenario of a run shares: where its files go and what observes it."""

    run_id: str
    out_dir: Path  # k6 summaries go to out_dir/k6
    targets_dir: Path | None  # Prometheus file_sd directory; None = do not write
    influxdb_url: str | None
    prometheus_url: str | None  # waited on for each service's final scrape; None = do not wait
    lab_pids: tuple[int, ...] = ()  # the Prometheus and InfluxDB this run started: accounted apart
    watch: live.Watch | None = None  # shows each measured window as it runs (a terminal's live line)


def run_scenario(
    scenario: Scenario, config: RunConfig, backend: Backend, settings: BackendSettings, say: Say
) -> ScenarioOutcome:
    """One scenario from start to collect; a failure is in the outcome, never raised."""
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
    metered = interference.MeteredBackend(
        backend, interference.read_snapshot if unmetered is None else None, config.lab_pids
    )
    try:
        with _timed(timings, "start"):
            handle = backend.start_service(scenario)
        for note in handle.notes:
            say(f"    note: {note}")
        if config.targets_dir is not None:
            # Now, not after health: discovery and the first scrape overlap the checks and warm-up.
            prometheus_sd.write(config.targets_dir, config.run_id, scenario, handle)
        with _timed(timings, "health"):
            service_checks.wait_healthy(backend, handle, scenario.target, ca_file, settings.start_timeout_s)
        with _timed(timings, "verify"):
            verification = service_checks.verify(handle, scenario, ca_file)
        if not verification.ok:
            raise ScenarioFailed("verify", "; ".join(verification.failures))
        # k6 split into instances, one CPU of the k6 side each (k6_instances; "auto" resolves here).
        instances = k6.instances_for(scenario.k6_instances, handle.k6_cpus, scenario.load_model)
        if instances > 1:
            places = handle.k6_places[:instances] or [f"CPU {c}" for c in handle.k6_cpus[:instances]]
            say(f"    k6: {instances} instances by execution segments, one each on {', '.join(places)}")
        api = config.watch is not None and backend.name in live.BACKENDS_WITH_K6_HERE
        invocation = _invocation_factory(scenario, config, settings, handle, instances=instances, api=api)
        if scenario.warmup_s > 0:
            with _timed(timings, "warmup"):
                warmup = k6.run(backend, handle, invocation(True), measured=False)
            _check_warmup(warmup)
        with _timed(timings, "measure"), _marked_window(config, scenario, say):
            if scenario.load_model.search is not None:
                search = capacity.search(scenario, handle, metered, invocation, say)
                k6_run = search.run  # the search checked every step
            else:
                window_invocation = invocation(False)
                with _watched(config, scenario, window_invocation):
                    k6_run = k6.run(metered, handle, window_invocation, measured=True)
                _check_measured(k6_run)
        if config.prometheus_url is not None and config.targets_dir is not None and handle.prometheus_target:
            with _timed(timings, "scrape"):
                _await_final_scrape(config.prometheus_url, config.run_id, scenario, say)
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
        host = interference.scenario_section(metered.window, handle, usage, unmetered)
    timings["overhead"] = sum(timings.get(phase, 0.0) for phase in OVERHEAD_PHASES)
    timings["total"] = time.monotonic() - began
    return ScenarioOutcome(
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
        host=host,
        relay_cpu_seconds=metered.relay_cpu_seconds,
        search=search,
    )


def _invocation_factory(
    scenario: Scenario,
    config: RunConfig,
    settings: BackendSettings,
    handle: ServiceHandle,
    *,
    instances: int = 1,
    api: bool = False,
) -> Callable[..., K6Invocation]:
    """api: the measured run (not a warm-up or a search step) serves k6's REST API for the live line."""

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
            api=api and not warmup and step is None,
        )

    (config.out_dir / "k6").mkdir(parents=True, exist_ok=True)
    return invocation


def _await_final_scrape(prometheus_url: str, run_id: str, scenario: Scenario, say: Say) -> None:
    """Keep the service up until Prometheus has scraped it after its workers' last flush."""
    after = time.time() + FLUSH_SECONDS
    # The next scrape comes within one interval; its own duration and the API's answer add little.
    timeout_s = FLUSH_SECONDS + _SCRAPE_INTERVAL_S + 1.0
    problem = prometheus_sd.wait_scraped_after(prometheus_url, run_id, scenario, after, timeout_s)
    if problem:
        say(f"    note: {problem}; its final counters may be missing")


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


def _watched(config: RunConfig, scenario: Scenario, invocation: K6Invocation) -> AbstractContextManager[None]:
    if config.watch is None:
        return nullcontext()
    return config.watch(live.Window(scenario.id, scenario.measured_seconds, live.api_addresses(invocation)))


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
