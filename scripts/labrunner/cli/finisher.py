"""The scenarios of a session, measured on the main thread, each one's finish (and the judging and
writing of its result) handed to the finisher thread to run beside the next scenario's start."""

import traceback
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from labrunner import interrupts
from labrunner.backends.base import Backend, BackendSettings, ScenarioFailed
from labrunner.cli.progress import Kept, Progress
from labrunner.cli.session_config import SessionConfig
from labrunner.model.scenario import Scenario
from labrunner.report.summary import write_summaries
from labrunner.results import record
from labrunner.results.store import (
    write_result,
)
from labrunner.results.trust import Verdict
from labrunner.run.duet import finish_duet, measure_duet
from labrunner.run.outcome import ScenarioOutcome
from labrunner.run.runner import ScenarioRun, measure_scenario
from labrunner.say import Say


@dataclass(frozen=True)
class _Finishing:
    """A scenario handed to the finisher: its place in the run, whether the next scenario started
    beside its finish (decided by the main thread: at that start, or False when it waits for it),
    and its kept result to come."""

    index: int
    next_started: "Future[bool]"
    kept: "Future[Kept]"


class Scenarios:
    """The scenarios of a session, measured one at a time on the main thread, each one's finish (and
    the judging and writing of its result) handed to the finisher thread to run beside the next
    scenario's start; and which of them failed."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        backend: Backend,
        settings: BackendSettings,
        progress: Progress,
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
        # A duet's two sides, each on its own thread, for the whole session (run.duet.measure_duet).
        self._duet_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="duet")

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
            pair,
            self._config.run,
            self._backend,
            self._settings,
            self._say,
            threads=self._duet_threads,
            before_measure=self.settle,
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
        self._duet_threads.shutdown(wait=True)
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


def _keep(outcome: ScenarioOutcome, out: Path, run_id: str, order: Sequence[str]) -> Kept:
    """Judge and write a scenario's result, then the summaries; never raises. A result that cannot be
    written makes its scenario failed (phase "record"), and that failure is written in its place
    when it can be: --resume runs a scenario again unless an ok result of it is on disk."""
    problems: list[str] = []
    try:
        verdict = record.judge_outcome(outcome)
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
