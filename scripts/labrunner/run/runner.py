"""Run one scenario in two halves: measure (start, health, verify, warm-up, the measured window) and
finish (the final scrape, stop and collect), which the session may run beside the next scenario's
measure. Neither half raises for a scenario's failure: it is in the outcome. Writes the scenario's
Prometheus target file (removed at the stop) and k6's summary files, and marks the measured window
in InfluxDB; the scenario's result is written by the session (cli/session.py), not here."""

import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
from labrunner.model.scenario import Scenario
from labrunner.observe import annotations, interference, prometheus_sd
from labrunner.run import capacity, connections, live, service_checks, uploads
from labrunner.run.k6.execute import execute
from labrunner.run.k6.invocation import K6Setup
from labrunner.run.k6.result import EXIT_THRESHOLDS_CROSSED, K6Run
from labrunner.run.k6.segments import instances_for
from labrunner.run.outcome import ScenarioOutcome
from labrunner.say import Say
from services.common.metrics import FLUSH_SECONDS

# Phases outside k6's runs: those on the run's critical path, and the finish, which overlaps the
# next scenario's start except on an emulated network.
CRITICAL_PHASES = ("start", "health", "verify", "waited")
FINISH_PHASES = ("scrape", "stop", "collect")
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
    # The speed reference's counters (run.speed_reference), read around each measured window; None: none runs.
    speed_reference: interference.ReferenceReader | None = None
    watch: live.Watch | None = None  # shows each measured window as it runs (a terminal's live line)


def measure_scenario(
    scenario: Scenario,
    config: RunConfig,
    backend: Backend,
    settings: BackendSettings,
    say: Say,
    *,
    before_measure: Callable[[], None] = lambda: None,
) -> "ScenarioRun":
    """The scenario from its start to the end of its measured window; its service still runs, owned
    by the returned run until its finish() stops it.

    before_measure runs once the warm-up is over, before the measured window opens: the session
    waits there for the previous scenario's finish, so its stop falls in this one's start and
    warm-up, never in a measured window. An interruption (Ctrl-C) stops this scenario's service
    before it propagates.
    """
    run = ScenarioRun(scenario, config, backend, settings, say)
    run.measure(before_measure)
    return run


class ScenarioRun:
    """One scenario's state between its two halves: measure (start to the measured window) and
    finish (the final scrape, stop and collect). measure runs on the main thread; finish may run
    on the session's finisher thread, and touches only this scenario's service."""

    def __init__(
        self, scenario: Scenario, config: RunConfig, backend: Backend, settings: BackendSettings, say: Say
    ) -> None:
        self.scenario = scenario
        self.config = config
        self.backend = backend
        self.settings = settings
        self.say = say
        self.timings: dict[str, float] = {}
        self.handle: ServiceHandle | None = None
        self.verification: service_checks.Verification | None = None
        self.k6_run: K6Run | None = None
        self.search: capacity.Outcome | None = None
        self.k6_setup: K6Setup | None = None  # set by prepare()
        self.failure: ScenarioFailed | None = None
        self.handle_to_stop: ServiceHandle | None = None  # the service, until stop() has stopped it
        self._stop_lock = threading.Lock()  # stop() may be asked by the main thread and the finisher
        self.usage: ServiceUsage | None = None
        # The connections from k6 the service held in each k6 run (run.connections.Watch.held), by phase.
        self.connections_seen: dict[str, int | None] = {}
        self.host: Mapping[str, Any] | None = None
        self.started_at = datetime.now(UTC)
        self.began = time.monotonic()
        # /proc/stat around every measured k6 run: what others took on the scenario's CPUs.
        self.unmetered = interference.unavailable(backend)
        self.metered = interference.MeteredBackend(
            backend,
            interference.read_snapshot if self.unmetered is None else None,
            config.lab_pids,
            config.speed_reference,
        )

    def measure(self, before_measure: Callable[[], None]) -> None:
        """prepare(), warm_up(), before_measure(), window(): the scenario's first half when it runs alone."""
        self.prepare()
        if self.failure is None:
            self.warm_up()
        if self.failure is None:
            with _timed(self.timings, "waited"):  # for the previous scenario's finish
                before_measure()
            self.window()

    def prepare(self) -> None:
        """Start, health and verify; a failure is recorded (self.failure), never raised."""
        scenario, config, settings, say, timings = (
            self.scenario,
            self.config,
            self.settings,
            self.say,
            self.timings,
        )
        ca_file = settings.certs_dir / certs.CA_FILE
        with self._owned():
            with _timed(timings, "start"):
                self.handle = self.handle_to_stop = handle = self.backend.start_service(scenario)
            for note in handle.notes:
                say(f"    note: {note}")
            if config.targets_dir is not None:
                # Now, not after health: discovery and the first scrape overlap the checks and warm-up.
                prometheus_sd.write(config.targets_dir, config.run_id, scenario, handle)
            with _timed(timings, "health"):
                service_checks.wait_healthy(
                    self.backend, handle, scenario.target, ca_file, settings.start_timeout_s
                )
            with _timed(timings, "verify"):
                upload = uploads.upload_body(config.out_dir / "k6", scenario)
                self.verification = service_checks.verify(handle, scenario, ca_file, upload)
            if not self.verification.ok:
                raise ScenarioFailed("verify", "; ".join(self.verification.failures))
            self.k6_setup = self._k6_setup(handle, ca_file, upload)

    def _k6_setup(self, handle: ServiceHandle, ca_file: Path, upload: uploads.UploadBody | None) -> K6Setup:
        """What this scenario's k6 runs share: k6 split into instances, one CPU of the k6 side each
        (k6_instances; "auto" resolves here), and k6's API for the live line when one shows the window."""
        scenario, config, settings = self.scenario, self.config, self.settings
        instances = instances_for(scenario.k6_instances, handle.k6_cpus, scenario.load_model)
        if instances > 1:
            places = handle.k6_places[:instances] or [f"CPU {c}" for c in handle.k6_cpus[:instances]]
            self.say(f"    k6: {instances} instances by execution segments, one each on {', '.join(places)}")
        k6_dir = config.out_dir / "k6"
        k6_dir.mkdir(parents=True, exist_ok=True)
        return K6Setup(
            scenario,
            handle,
            run_id=config.run_id,
            root=settings.root,
            ca_file=ca_file,
            k6_dir=k6_dir,
            log_file=settings.logs_dir / f"{scenario.id}.k6.log",
            influxdb_url=config.influxdb_url,
            instances=instances,
            api=config.watch is not None
            and self.backend.name in live.BACKENDS_WITH_K6_HERE
            and not scenario.target.python_driven,
            upload=upload,
        )

    def warm_up(self) -> None:
        """The unmeasured k6 run before the window, when the scenario has one; a failure is recorded."""
        k6_setup = self.k6_setup
        assert k6_setup is not None, "warm_up() before a prepare() that passed"
        if self.scenario.warmup_s <= 0:
            return
        with self._owned():
            with _timed(self.timings, "warmup"), self._connections(self.scenario.warmup_s) as watch:
                warmup = execute(self.backend, k6_setup.handle, k6_setup.warmup(), measured=False)
            _check_warmup(warmup)
            self._check_connections(watch, "warmup")

    def window(self) -> None:
        """The measured window (a capacity search's steps); a failure is recorded, never raised."""
        scenario, config, k6_setup = self.scenario, self.config, self.k6_setup
        assert k6_setup is not None, "window() before a prepare() that passed"
        with self._owned(), _timed(self.timings, "measure"), _marked_window(config, scenario, self.say):
            if scenario.load_model.search is not None:
                self.search = capacity.search(k6_setup, self.metered, self.say)
                self.k6_run = self.search.run  # the search checked every step
            else:
                invocation = k6_setup.window()
                with _watched(config, scenario, invocation), self._connections(scenario.duration_s) as watch:
                    run = execute(self.metered, k6_setup.handle, invocation, measured=True)
                self.k6_run = run
                _check_measured(run)
                self._check_connections(watch, "measured window")
                if scenario.churn is not None and run.metrics is not None:
                    m = run.metrics
                    connections.check_churn(scenario.churn, m.attempts, m.connections_opened, m.vus_max or 0)

    def _connections(self, seconds: float) -> connections.Watch:
        """Counts the service's connections from k6 during a k6 run of `seconds`."""
        handle = self.handle
        assert handle is not None
        planned = self.scenario.connections if self._connections_checked else None
        return connections.Watch(lambda: self.backend.service_connections(handle), seconds, planned)

    @property
    def _connections_checked(self) -> bool:
        """Whether the counts are held to the plan. Not churning (a closing connection outlives its
        successor's dial), nor over QUIC, whose connections are not sockets: the service's one UDP
        socket carries them all (the driver fails a VU that gets no h3)."""
        return self.scenario.churn is None and self.scenario.target.protocol != "http3"

    def _check_connections(self, watch: connections.Watch, phase: str) -> None:
        """The counts against the plan (run.connections.check), kept for the result."""
        self.connections_seen[phase] = watch.held
        if self._connections_checked:
            connections.check(self.scenario.connections, watch.held, phase, self.scenario.connection_model)

    @contextmanager
    def _owned(self) -> Iterator[None]:
        """A scenario's failure recorded as its own; an interruption (Ctrl-C) stops its service first."""
        try:
            yield
        except ScenarioFailed as exc:
            self.failure = exc
        except Exception as exc:  # a bug or an OS error in one scenario must not end the run
            self.failure = ScenarioFailed("internal", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        except BaseException:  # Ctrl-C: the run ends, and this run's service with it
            self.stop()
            raise

    @property
    def may_overlap(self) -> bool:
        """Whether the next scenario may start before this one's finish is done: not on an emulated
        network, whose link and addresses must be gone before the next one is made."""
        return not self.scenario.network.emulated

    def finish(self, overlapped: Callable[[], bool]) -> ScenarioOutcome:
        """The final scrape, the stop and the collect; never raises (a failure is in the outcome, and
        the first cause stays the scenario's). overlapped is asked once the service has stopped:
        whether the next scenario started beside this finish, which was then off the critical path."""
        try:
            return self._finish(overlapped)
        except Exception as exc:  # a bug in the collect: the scenario fails, its service is stopped
            self._failed_internally(exc)
            self.stop()
            try:
                return self._outcome(overlapped)
            except Exception as again:  # a bug in the outcome itself: its cause, nothing measured
                self._failed_internally(again)
                return self._unmeasured_outcome()

    def _finish(self, overlapped: Callable[[], bool]) -> ScenarioOutcome:
        scenario, config, handle, timings = self.scenario, self.config, self.handle, self.timings
        try:
            if (
                self.failure is None
                and config.prometheus_url is not None
                and config.targets_dir is not None
                and handle is not None
                and handle.prometheus_target
            ):
                with _timed(timings, "scrape"):
                    _await_final_scrape(config.prometheus_url, config.run_id, scenario, self.say)
        except Exception as exc:  # a bug or an OS error: recorded, and the service still stops
            self._failed_internally(exc)
        finally:
            with _timed(timings, "stop"):
                self.stop()
        with _timed(timings, "collect"):
            self.host = interference.scenario_section(self.metered.window, handle, self.usage, self.unmetered)
        return self._outcome(overlapped)

    def stop(self) -> None:
        """Stop the service once, whichever thread asks first (its target file first: Prometheus
        stops scraping it). Never raises: a failed stop is recorded, and the backend's close() stops
        what it could not."""
        with self._stop_lock:
            handle, self.handle_to_stop = self.handle_to_stop, None
        if handle is None:
            return
        if self.config.targets_dir is not None:
            target = prometheus_sd.file_for(self.config.targets_dir, self.config.run_id, self.scenario)
            try:
                target.unlink(missing_ok=True)
            except OSError as exc:  # the service still stops; the run's end removes the run's targets
                self.say(f"    note: {self.scenario.id}: its Prometheus target file stays: {exc}")
        try:
            self.usage = self.backend.stop_service(handle)
        except ScenarioFailed as exc:  # an engine's own explanation
            self.failure = self.failure or exc
        except Exception as exc:  # e.g. a cgroup that would not drain: record, go on
            message = f"{type(exc).__name__}: {exc}"
            self.failure = self.failure or ScenarioFailed("stop", message, traceback.format_exc())

    def _failed_internally(self, exc: Exception) -> None:
        """A bug or an OS error in this scenario: its failure, unless it had failed already."""
        message = f"{type(exc).__name__}: {exc}"
        self.failure = self.failure or ScenarioFailed("internal", message, traceback.format_exc())

    def _outcome(self, overlapped: Callable[[], bool]) -> ScenarioOutcome:
        timings = self.timings
        # The run's wall time this scenario added beyond k6's: an overlapped finish added none.
        beside_the_next = overlapped()
        on_path = CRITICAL_PHASES if beside_the_next else (*CRITICAL_PHASES, *FINISH_PHASES)
        timings["overhead"] = sum(timings.get(phase, 0.0) for phase in on_path)
        if beside_the_next:
            timings["overlapped"] = sum(timings.get(phase, 0.0) for phase in FINISH_PHASES)
        timings["total"] = time.monotonic() - self.began
        return replace(
            self._unmeasured_outcome(),
            handle=self.handle,
            verification=self.verification,
            k6_run=self.k6_run,
            usage=self.usage,
            timings_s=self.timings,
            host=self.host,
            relay_cpu_seconds=self.metered.relay_cpu_seconds,
            search=self.search,
            connections_seen=self.connections_seen,
        )

    def _unmeasured_outcome(self) -> ScenarioOutcome:
        """The scenario and its failure, nothing measured: what _outcome adds to, and the outcome
        when _outcome itself failed."""
        return ScenarioOutcome(
            run_id=self.config.run_id,
            backend=self.backend.name,
            scenario=self.scenario,
            started_at=self.started_at,
            finished_at=datetime.now(UTC),
            failure=self.failure,
            handle=None,
            verification=None,
            k6_run=None,
            usage=None,
            timings_s={"overhead": 0.0, "total": time.monotonic() - self.began},
        )


def _await_final_scrape(prometheus_url: str, run_id: str, scenario: Scenario, say: Say) -> None:
    """Keep the service up until Prometheus has scraped it after its workers' last flush."""
    after = time.time() + FLUSH_SECONDS
    # The next scrape comes within one interval; its own duration and the API's answer add little.
    timeout_s = FLUSH_SECONDS + _SCRAPE_INTERVAL_S + 1.0
    problem = prometheus_sd.wait_scraped_after(prometheus_url, run_id, scenario, after, timeout_s)
    if problem:
        say(f"    note: {scenario.id}: {problem}; its final counters may be missing")


def _check_warmup(run: K6Run) -> None:
    # Thresholds may fail while caches and connections warm up; anything else is fatal.
    if run.exit_code not in (0, EXIT_THRESHOLDS_CROSSED):
        raise ScenarioFailed("warmup", f"k6 exited with code {run.exit_code}", run.output_tail)


def _check_measured(run: K6Run) -> None:
    metrics = run.metrics
    if metrics is None:
        raise ScenarioFailed(
            "measure", f"k6 exited with code {run.exit_code} without a summary", run.output_tail
        )
    if run.exit_code == EXIT_THRESHOLDS_CROSSED:
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
