"""A run of the plan: resume, calibrate, each scenario run, judged and written, progress, summaries,
the manifest, and at the end the serialization benchmark and the report."""

import itertools
import random
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner import interrupts
from labrunner.backends.base import Backend, BackendSettings, ScenarioFailed
from labrunner.cli import grafana
from labrunner.files import write_json_atomic
from labrunner.model import duet
from labrunner.model.scenario import Plan, Scenario, units_of
from labrunner.observe import interference, prometheus_sd
from labrunner.report import answers, findings, payload, precision, serialization
from labrunner.report.build import PAYLOAD_FILE, SERIALIZATION_FILE, write_report
from labrunner.report.compare import group_results
from labrunner.report.summary import write_summaries
from labrunner.results import ladder, record, trust
from labrunner.results.store import (
    MANIFEST_FILE,
    build_manifest,
    load_results,
    read_manifest,
    resumable,
    write_result,
)
from labrunner.results.trust import Verdict
from labrunner.run import calibration
from labrunner.run.duet import finish_duet, measure_duet
from labrunner.run.outcome import ScenarioOutcome
from labrunner.run.runner import RunConfig, ScenarioRun, measure_scenario
from labrunner.say import Say

ASSUMED_OVERHEAD_S = 5.0  # per scenario, for the ETA until one has been measured


@dataclass(frozen=True)
class SessionConfig:
    """Run-wide choices from the command line."""

    run: RunConfig
    resume: bool
    argv: tuple[str, ...]
    backend_reason: str
    provenance: dict[str, Any]  # git, versions, host (see labrunner.results.provenance)
    # --precision: add rounds of the closed groups until every compared req/s ratio's interval is
    # within this share of its estimate, while --budget (seconds of rounds added) lasts.
    precision: float | None = None
    budget_s: float = 0.0


@dataclass(frozen=True)
class _Finishing:
    """A scenario handed to the finisher: its place in the run, whether the next scenario started
    beside its finish (decided by the main thread: at that start, or False when it waits for it),
    and its kept result to come."""

    index: int
    next_started: "Future[bool]"
    kept: "Future[Kept]"


@dataclass(frozen=True)
class Kept:
    """A finished scenario as the session reports it: its outcome (failed when its result could not
    be written), the verdict on it, and what of it could not be written."""

    outcome: ScenarioOutcome
    verdict: Verdict
    problems: tuple[str, ...] = ()


def run_plan(
    plan: Plan, config: SessionConfig, backend: Backend, settings: BackendSettings, say: Say
) -> bool:
    """Run every scenario not already done, in the plan's run order; True when none failed.

    One rule for every scenario: a failure, whether in its start, its measured window, its finish or
    the writing of its result, is that scenario's own (recorded with its cause, and reported on its
    line), and the run goes on. Each scenario's finish runs on the finisher thread; the next scenario
    starts beside it when it may overlap, else once it is done. A ladder rung over its target's
    closed-model capacity (labrunner.results.ladder) is not run: said, named in the manifest and the
    summary, and no failure.
    """
    run = config.run
    out = run.out_dir
    order = [s.id for s in plan.scenarios]  # the matrix's order, which the summaries read
    run_order = plan.run_order
    done = set(resumed(out, plan.run_order, say)) if config.resume else set()
    manifest_args = _manifest_args(plan, config, backend.name)
    to_run = [s for s in run_order if s.id not in done]
    # The same fixed workload before the first scenario and after the last, where the first
    # scenario's service runs: how fast this host's CPU was, and whether that changed.
    calibration_cpus = calibration.cpus_for(run_order[0]) if run_order else ()
    calibrations: dict[str, Any] = {}
    manifest_args["calibration"] = calibrations
    not_run: dict[str, str] = {}  # scenario id -> why, in run order

    def write_manifest_so_far() -> None:
        manifest = build_manifest(
            **manifest_args, not_run=not_run, finished_at=None, complete=False, all_ok=None
        )
        write_json_atomic(out / MANIFEST_FILE, manifest)

    write_manifest_so_far()
    progress = _Progress(run_order, done, say)
    if len(to_run) > 1:
        say("each scenario's service stops while the next one starts: its result line may follow that start")
    scenarios = _Scenarios(
        config, backend=backend, settings=settings, progress=progress, order=order, say=say
    )
    run_one, settle = scenarios.run_one, scenarios.settle
    interrupted = True
    closed_results: list[dict[str, Any]] | None = None  # read once, when the first rung comes
    sharpness: list[precision.Sharpness] = []  # --precision: each compared pair, once its rounds are done
    try:
        if run_order:
            calibrations["before"] = calibration.calibrate(calibration_cpus, "before", say)
        index = 0
        for unit in plan.run_units:
            first, index = index + 1, index + len(unit)
            if all(s.id in done for s in unit):  # a duet's block runs again unless both sides are done
                for number, scenario in enumerate(unit, start=first):
                    say(f"[{number}/{len(run_order)}] {scenario.id}: ok in an earlier session, skipped")
                continue
            if len(unit) == 2:
                scenarios.run_duet(first, (unit[0], unit[1]))
                continue
            [scenario] = unit
            if scenario.load_model.rung is not None:
                if closed_results is None:
                    # The rungs' rates come from the closed rounds' results, all run before them:
                    # once the last one is written, they are what sets every rung.
                    settle()
                    closed_results = load_results(out)
                if isinstance(resolved := ladder.resolve(scenario, closed_results), str):
                    not_run[scenario.id] = resolved
                    progress.not_run(index, scenario, resolved)
                    write_manifest_so_far()
                    continue
                run_one(index, resolved)  # at its rate in this run, which its result records
                progress.measured(scenario)  # the planned rung, rateless, leaves the ETA too
                continue
            run_one(index, scenario)
        settle()
        if config.precision is not None:
            added = _sharpen(
                plan,
                config,
                order,
                run_unit=scenarios.run_unit,
                settle=settle,
                extend=progress.extend,
                say=say,
            )
            sharpness = precision.sharpness(group_results(load_results(out, order)))
            manifest_args["precision"] = _precision_record(config, sharpness, len(added))
        if plan.scenarios:
            calibrations["after"] = calibration.calibrate(calibration_cpus, "after", say)
        interrupted = False
    finally:
        # A Ctrl-C from here on waits until the end of this block: the cleanup is never cut short.
        with interrupts.held():
            scenarios.shutdown()  # an interrupted run still stops the service finishing
            _close(backend, run, say)
            manifest = build_manifest(
                **manifest_args,
                not_run=not_run,
                finished_at=datetime.now(UTC),
                complete=not interrupted,
                all_ok=None if interrupted else not scenarios.failed,
            )
            _write_last(out, manifest, run.run_id, order, say)
    _say_end(out, order, scenarios.failed, not_run, say)
    if config.precision is not None:
        say(precision.outcome(sharpness, config.precision))
    say_findings(out, order, plan.preset, say)
    if grafana_url := grafana.dashboard_url(read_manifest(out)):
        say(f"grafana: {grafana_url}")
    return not scenarios.failed


# Where --resume moves the result files it does not trust: kept, out of the run's results.
IGNORED_DIR = "ignored"


def resumed(out: Path, scenarios: Sequence[Scenario], say: Say) -> frozenset[str]:
    """--resume: the scenarios whose ok result on disk is the planned one (store.resumable), which the
    run skips; every result file it does not trust is named with why and moved to scenarios/ignored/,
    out of the summaries and the report (its scenario, when planned, runs again)."""
    found = resumable(out, scenarios)
    if found.ignored:
        aside = out / "scenarios" / IGNORED_DIR
        aside.mkdir(exist_ok=True)
        say(f"resume: {len(found.ignored)} result file(s) not trusted, moved to {aside}:")
        for name, why in found.ignored.items():
            (out / "scenarios" / name).replace(aside / name)
            say(f"  {name}: {why}")
    return found.done


def _manifest_args(plan: Plan, config: SessionConfig, backend: str) -> dict[str, Any]:
    """What every manifest of this session says, however far it got."""
    run, out = config.run, config.run.out_dir
    started_at, resumed = _sessions(out, config.resume)
    return {
        "run_id": run.run_id,
        "plan": plan,
        "backend": {"name": backend, "reason": config.backend_reason},
        "provenance": _provenance(out, config.resume, config.provenance, resumed),
        "argv": config.argv,
        "started_at": started_at,
        "resumed_at": resumed,
        "settings": {
            "out_dir": str(out),
            "influxdb_url": run.influxdb_url,
            "prometheus_targets_dir": str(run.targets_dir) if run.targets_dir else None,
        },
    }


def _write_last(out: Path, manifest: dict[str, Any], run_id: str, order: Sequence[str], say: Say) -> None:
    """The session's last manifest, then the summaries; a summary that fails is said, not raised."""
    write_json_atomic(out / MANIFEST_FILE, manifest)
    try:
        write_summaries(out, run_id, order)  # CPU per request in the final calibration's units
    except Exception as exc:  # the results are written; scripts/report.py makes these again
        say(f"summaries not written: {type(exc).__name__}: {exc}")


def _say_end(
    out: Path, order: Sequence[str], failed: Sequence[str], not_run: Mapping[str, str], say: Say
) -> None:
    """How many scenarios were ok (of the planned ones and those --precision added), and where."""
    say(
        f"{len(order) - len(failed) - len(not_run)} of {len(order)} scenarios ok"
        + (f"; {len(not_run)} not run (summary.md says why)" if not_run else "")
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nresults: {out}/summary.md"
    )


class _Scenarios:
    """The scenarios of a session, measured one at a time on the main thread, each one's finish (and
    the judging and writing of its result) handed to the finisher thread to run beside the next
    scenario's start; and which of them failed."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        backend: Backend,
        settings: BackendSettings,
        progress: "_Progress",
        order: list[str],  # the run's, which --precision extends: each finish gets a copy
        say: Say,
    ) -> None:
        self._config, self._backend, self._settings = config, backend, settings
        self._progress, self._order, self._say = progress, order, say
        self.failed: list[str] = []
        # At most one: the previous scenario, finishing on the finisher thread. Only the main thread
        # touches this list; the finisher gets what it needs as arguments.
        self._finishing: list[_Finishing] = []
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")

    def run_one(self, index: int, scenario: Scenario) -> None:
        """Measure a scenario and hand its finish to the finisher, beside the next scenario's start
        when it may overlap (the next one's start says so), else waited for here."""
        self._progress.starting(index, scenario)
        for entry in self._finishing:  # the previous finish now runs beside this start
            if not entry.next_started.done():
                entry.next_started.set_result(True)
        run = self._config.run
        measured = measure_scenario(
            scenario, run, self._backend, self._settings, self._say, before_measure=self.settle
        )
        try:
            self._progress.measured(scenario)
            self.settle()  # when this scenario ended before its measured window
        except BaseException:  # Ctrl-C before the finisher owns it: the service stops here
            measured.stop()
            raise
        with interrupts.held():  # handed over whole: from here the finisher owns the service
            next_started: Future[bool] = Future()
            kept = self._finisher.submit(self._keep, measured, next_started, tuple(self._order))
            self._finishing.append(_Finishing(index, next_started, kept))
        if not measured.may_overlap:
            self.settle()

    def run_unit(self, index: int, unit: tuple[Scenario, ...]) -> None:
        """A scenario alone (run_one) or a duet block (run_duet)."""
        if len(unit) == 2:
            self.run_duet(index, (unit[0], unit[1]))
        else:
            [scenario] = unit
            self.run_one(index, scenario)

    def run_duet(self, index: int, pair: tuple[Scenario, Scenario]) -> None:
        """Measure a duet block's two scenarios together (run.duet) and hand their finish to the
        finisher as one, beside the next scenario's start (whose measured window waits for it)."""
        for number, scenario in enumerate(pair, start=index):
            self._progress.starting(number, scenario)
        for entry in self._finishing:
            if not entry.next_started.done():
                entry.next_started.set_result(True)
        runs = measure_duet(
            pair, self._config.run, self._backend, self._settings, self._say, before_measure=self.settle
        )
        try:
            for scenario in pair:
                self._progress.measured(scenario)
            self.settle()
        except BaseException:
            for run in runs:
                run.stop()
            raise
        with interrupts.held():  # handed over whole: the finisher owns both services from here
            next_started: Future[bool] = Future()
            order = tuple(self._order)
            kept = self._finisher.submit(self._keep_duet, runs, next_started, order)
            self._finishing += [
                _Finishing(index, next_started, _side(kept, 0)),
                _Finishing(index + 1, next_started, _side(kept, 1)),
            ]

    def _keep_duet(
        self, runs: tuple[ScenarioRun, ScenarioRun], next_started: "Future[bool]", order: tuple[str, ...]
    ) -> tuple[Kept, Kept]:
        """On the finisher thread: both finishes, then each side judged and written (_keep)."""
        run = self._config.run
        outcomes = finish_duet(runs, next_started.result)
        return (
            _keep(outcomes[0], run.out_dir, run.run_id, order),
            _keep(outcomes[1], run.out_dir, run.run_id, order),
        )

    def settle(self) -> None:
        """Wait for the previous scenario's finish and written result, and report it."""
        self._nothing_started_beside()
        while self._finishing:
            try:
                kept = self._finishing[0].kept.result()  # never raises: _keep returns every failure
                self._progress.finished(self._finishing[0].index, kept)
                if kept.outcome.failure is not None:
                    self.failed.append(kept.outcome.scenario.id)
            finally:
                self._finishing.pop(0)

    def shutdown(self) -> None:
        """The last finish done and reported, and the finisher gone."""
        self._nothing_started_beside()
        self._finisher.shutdown(wait=True)
        self.settle()

    def _nothing_started_beside(self) -> None:
        """The finishing scenario's finish is on the critical path: no scenario started beside it."""
        for entry in self._finishing:
            if not entry.next_started.done():
                entry.next_started.set_result(False)

    def _keep(self, measured: ScenarioRun, next_started: "Future[bool]", order: tuple[str, ...]) -> Kept:
        """On the finisher thread: the scenario's finish, its verdict and its written result; never
        raises (ScenarioRun.finish and _keep return every failure)."""
        run = self._config.run
        return _keep(measured.finish(next_started.result), run.out_dir, run.run_id, order)


def _side(both: "Future[tuple[Kept, Kept]]", side: int) -> "Future[Kept]":
    """One side of a duet's kept pair, as settle() reads a scenario's."""
    one: Future[Kept] = Future()
    both.add_done_callback(lambda done: one.set_result(done.result()[side]))
    return one


def _close(backend: Backend, run: RunConfig, say: Say) -> None:
    """Whatever of the run's is left stopped, and its Prometheus targets removed; never raises, so
    the manifest is still written."""
    try:
        backend.close()
    except Exception as exc:  # what it could not stop, it names
        say(f"stopping what was left: {type(exc).__name__}: {exc}")
    if run.targets_dir is not None:
        try:
            prometheus_sd.delete_run(run.targets_dir, run.run_id)
        except OSError as exc:
            say(f"the run's Prometheus target files stay in {run.targets_dir}: {exc}")


# What a scenario adds beyond k6's time when a round's length is estimated against the budget.
_ROUND_OVERHEAD_S = 2.0


def _sharpen(
    plan: Plan,
    config: SessionConfig,
    order: list[str],
    *,
    run_unit: Callable[[int, tuple[Scenario, ...]], None],
    settle: Callable[[], None],
    extend: Callable[[Sequence[Scenario]], int],
    say: Say,
) -> list[str]:
    """--precision: rounds of one more repeat of every closed group in a pair whose req/s ratio is
    not yet within the precision, while the budget holds the next round (each shuffled by the run's
    seed and its number). The ids it adds join `order` (the matrix's, in which pairs are read, so
    which side of a pair is the candidate never depends on the order they ran in); returns them."""
    assert config.precision is not None
    out, deadline = config.run.out_dir, time.monotonic() + config.budget_s
    closed = {s.group: s for s in plan.scenarios if s.load_model.rung is None}
    added: list[str] = []
    for number in itertools.count(1):
        results = load_results(out, order)
        groups = precision.to_repeat(precision.sharpness(group_results(results)), config.precision)
        last_repeat = {r["scenario"]["group"]: _repeat(r) for r in sorted(results, key=_repeat)}
        round_ = [duet.next_block(closed[g.id], last_repeat[g.id] + 1) for g in groups if g.id in closed]
        if not round_:
            return added
        needed = sum(s.warmup_s + s.measured_seconds + _ROUND_OVERHEAD_S for s in round_)
        if time.monotonic() + needed > deadline:
            say(f"precision: round {number} ({len(round_)} scenarios, {needed:.0f} s) would outlast --budget")
            return added
        units = units_of(round_)  # a duet's two sides run as one block
        random.Random(f"{plan.seed}-precision-{number}").shuffle(units)
        say(
            f"precision: round {number}: one more repeat of the {len(round_)} groups of the pairs "
            f"not yet within ±{config.precision:.0%}"
        )
        index = extend([s for unit in units for s in unit])
        for unit in units:
            run_unit(index, unit)
            index += len(unit)
            added += [s.id for s in unit]
            order += [s.id for s in unit]
        settle()
    raise AssertionError("unreachable: itertools.count never ends")


def _repeat(result: dict[str, Any]) -> int:
    return int(result["scenario"]["repeat"])


def _precision_record(
    config: SessionConfig, pairs: Sequence[precision.Sharpness], added: int
) -> dict[str, Any]:
    """The manifest's account of --precision: what was asked, what it added, which pairs reached it."""
    assert config.precision is not None
    return {
        "target": config.precision,
        "budget_s": config.budget_s,
        "scenarios_added": added,
        "pairs": [
            {
                "pair": p.pair,
                "question": p.question,
                "half_width": p.half_width,
                "reached": p.reached(config.precision),
            }
            for p in pairs
        ],
    }


def _keep(outcome: ScenarioOutcome, out: Path, run_id: str, order: Sequence[str]) -> Kept:
    """Judge and write a scenario's result, then the summaries; never raises. A result that cannot be
    written makes its scenario failed (phase "record"), and that failure is written in its place
    when it can be: --resume runs a scenario again unless an ok result of it is on disk."""
    problems: list[str] = []
    try:
        verdict = trust.judge_outcome(outcome)
        write_result(out, record.build_result(outcome, verdict))
    except Exception as exc:
        problem = f"its result could not be written: {type(exc).__name__}: {exc}"
        if outcome.failure is None:
            outcome = replace(outcome, failure=ScenarioFailed("record", problem, traceback.format_exc()))
        else:  # the scenario had failed already: that cause stays its own
            problems.append(problem)
        verdict = Verdict(suspect=(), lower_bound=None)
        try:
            write_result(out, record.build_result(outcome, verdict))
        except Exception as again:
            problems.append(f"nor its failure ({type(again).__name__}: {again}); --resume runs it again")
    try:
        write_summaries(out, run_id, order)
    except Exception as exc:
        problems.append(f"summaries not updated ({type(exc).__name__}: {exc}); the run's end writes them")
    return Kept(outcome, verdict, tuple(problems))


def say_findings(out_dir: Path, order: list[str], preset: str, say: Say) -> None:
    """The run's findings on one screen: summary.md's first section, its notes cut to the most
    important when they would not fit (findings.plain)."""
    found = answers.for_run(group_results(load_results(out_dir, order)), preset)
    for line in findings.plain(found):
        say(line)


def finish(run_dir: Path, benchmark: bool, say: Say) -> None:
    """What run_matrix.py does after the last scenario: payload table, benchmark, report.

    The serialization benchmark runs only after a run that was not interrupted, on the
    now idle host. Failures are reported, never raised: the results are already safe.
    """
    try:
        if not (run_dir / PAYLOAD_FILE).exists():
            write_json_atomic(run_dir / PAYLOAD_FILE, payload.as_document(payload.measure()))
        if benchmark and not (run_dir / SERIALIZATION_FILE).exists():
            say("serialization benchmark (about 10 s)")
            budget = serialization.FULL
            write_json_atomic(
                run_dir / SERIALIZATION_FILE, serialization.as_document(serialization.run(budget), budget)
            )
        md, _ = write_report(run_dir)
        say(f"report: {md} (and report.html)")
    except Exception:  # a report bug must not turn a finished run into a failed one
        say(f"report: not written:\n{traceback.format_exc()}\nregenerate with: scripts/report.py {run_dir}")


def _sessions(out_dir: Path, resume: bool) -> tuple[datetime, list[str]]:
    """When the run started and when it was resumed: a resumed run keeps its first start."""
    now = datetime.now(UTC)
    if not resume:
        return now, []
    previous = read_manifest(out_dir)
    try:
        return datetime.fromisoformat(previous["started_at"]), [*previous["resumed_at"], now.isoformat()]
    except (ValueError, KeyError, TypeError):
        return now, [now.isoformat()]


# What says which code measured a run: a resumed run keeps its first session's, and lists each
# resuming session's under resumed_by.
_ORIGIN = ("release", "methodology", "git")


def _provenance(
    out_dir: Path, resume: bool, provenance: dict[str, Any], resumed_at: list[str]
) -> dict[str, Any]:
    """The manifest's provenance: this session's, but on --resume the release, methodology and git of
    the session that started the run (its results were measured by that code), with this session's
    added to resumed_by. A manifest without a release was written before 0.2.0."""
    if not resume:
        return provenance
    previous = read_manifest(out_dir)
    this_session = {"at": resumed_at[-1], **{key: provenance.get(key) for key in _ORIGIN}}
    return {
        **provenance,
        **{key: previous.get(key) for key in _ORIGIN},
        "resumed_by": [*previous.get("resumed_by", []), this_session],
    }


class _Progress:
    """Progress lines with elapsed time and an ETA from the overhead measured so far (the time each
    scenario added beyond k6's, its finish excluded when it overlapped the next scenario)."""

    def __init__(self, scenarios: tuple[Scenario, ...], done: set[str], say: Say) -> None:
        self._pending = [s for s in scenarios if s.id not in done]
        self._total = len(scenarios)
        self._began = time.monotonic()
        self._overheads: list[float] = []
        self._say = say

    def starting(self, index: int, scenario: Scenario) -> None:
        """The ETA counts this scenario and those after it: an earlier one may still be finishing,
        but its measured window, which the ETA counts, is over."""
        overhead = sum(self._overheads) / len(self._overheads) if self._overheads else ASSUMED_OVERHEAD_S
        eta = sum(s.warmup_s + s.measured_seconds + overhead for s in self._pending)
        self._say(
            f"[{index}/{self._total}] {scenario.id}: starting "
            f"(elapsed {_clock(time.monotonic() - self._began)}, ETA {_clock(eta)})"
        )

    def measured(self, scenario: Scenario) -> None:
        if scenario in self._pending:
            self._pending.remove(scenario)

    def extend(self, scenarios: Sequence[Scenario]) -> int:
        """Scenarios added to the run (a --precision round); returns the first one's index."""
        self._pending += scenarios
        self._total += len(scenarios)
        return self._total - len(scenarios) + 1

    def not_run(self, index: int, scenario: Scenario, reason: str) -> None:
        self.measured(scenario)  # out of the ETA
        self._say(f"[{index}/{self._total}] {scenario.id}: not run: {reason}")

    def finished(self, index: int, kept: Kept) -> None:
        outcome = kept.outcome
        self._overheads.append(outcome.timings_s["overhead"])
        line = outcome_line(outcome, kept.verdict)
        problems = "".join(f"\n    note: {outcome.scenario.id}: {problem}" for problem in kept.problems)
        self._say(f"[{index}/{self._total}] {outcome.scenario.id}: {line}{problems}")


def outcome_line(outcome: ScenarioOutcome, verdict: Verdict) -> str:
    """A finished scenario in one short line (about 150 characters with its id): its numbers, a flag
    per kind of suspect reason (the reasons in words are in summary.md), or why it failed."""
    timings = outcome.timings_s
    took = f"({timings['total']:.1f} s)"  # the overhead is in the result's timings and in the ETA
    failure = outcome.failure
    if failure is not None:
        detail = f"\n    {failure.log_tail.strip()[-2000:]}" if failure.log_tail.strip() else ""
        return f"FAILED in {failure.phase}: {failure.message} {took}{detail}"
    metrics = outcome.k6_run.metrics if outcome.k6_run else None
    parts = ["ok"]
    if metrics is not None:
        at_least = ">=" if verdict.lower_bound else ""  # the service can do at least this much
        p99 = metrics.latency_ms.get("p99")
        parts = [
            f"ok {at_least}{_figure(metrics.requests_per_second)} req/s",
            f"p99 {'n/a' if p99 is None else _figure(p99)} ms",
            f"{metrics.errors} err",
        ]
    service_cpu = outcome.service_cpu_utilisation
    if service_cpu is not None:
        parts.append(f"svc {service_cpu:.0%}")
    k6_cpu = outcome.k6_run.cpu_utilisation if outcome.k6_run else None
    if k6_cpu is not None:
        parts.append(f"k6 {k6_cpu:.0%}")
    parts.append(interference.describe(outcome.host))
    flags = f" SUSPECT:{','.join(verdict.flags)}" if verdict.flags else ""
    return ", ".join(parts) + f" {took}{flags}"


def _figure(value: float) -> str:
    """Three significant figures at most, never an exponent: 912, 95.1, 3.27."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
