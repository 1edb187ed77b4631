"""A duet block (model.duet): two scenarios started and checked one after the other in slot order,
their warm-ups and then their measured windows at the same time, then finished together, so that
each one's host figures count its partner's CPU as part of the measurement, not as interference."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from labrunner.backends.base import Backend, BackendSettings, ScenarioFailed
from labrunner.model.scenario import Scenario
from labrunner.observe import interference
from labrunner.run.outcome import ScenarioOutcome
from labrunner.run.runner import RunConfig, ScenarioRun
from labrunner.say import Say


def measure_duet(
    pair: tuple[Scenario, Scenario],
    config: RunConfig,
    backend: Backend,
    settings: BackendSettings,
    say: Say,
    *,
    threads: ThreadPoolExecutor,
    before_measure: Callable[[], None] = lambda: None,
) -> tuple[ScenarioRun, ScenarioRun]:
    """Both scenarios from their start to the end of their common measured window (starts, warm-ups
    and windows at once, each side on one of `threads`); their services still run, owned by the
    returned runs until finish_duet() stops them.

    `threads` (two) must outlive the services: the local backend's services stop when the thread
    that started them ends (PR_SET_PDEATHSIG), so a session keeps one pool for all its blocks.
    A side that fails before measuring fails its partner too (a duet measured alone would be no
    duet): the failure stays with this pair. The live line follows no duet (two windows at once).
    An interruption stops both services before it propagates.
    """
    quiet = replace(config, watch=None)
    runs = (
        ScenarioRun(pair[0], quiet, backend, settings, say),
        ScenarioRun(pair[1], quiet, backend, settings, say),
    )
    try:
        _both(threads, runs, ScenarioRun.prepare)  # slot 1's submitted first
        if _first_failed(runs) is None:
            _both(threads, runs, ScenarioRun.warm_up)
        if _first_failed(runs) is None:
            before_measure()
            _both(threads, runs, ScenarioRun.window)
            _k6_beside(runs)
        if (failed := _first_failed(runs)) is not None:
            _fail_partner(runs, failed)
    except BaseException:
        for run in runs:
            run.stop()
        raise
    return runs


def _both(
    threads: ThreadPoolExecutor, runs: tuple[ScenarioRun, ScenarioRun], step: Callable[[ScenarioRun], None]
) -> None:
    """One step of both runs at once; each records its own failure (the steps never raise)."""
    for running in [threads.submit(step, run) for run in runs]:
        running.result()


def finish_duet(
    runs: tuple[ScenarioRun, ScenarioRun], overlapped: Callable[[], bool]
) -> tuple[ScenarioOutcome, ScenarioOutcome]:
    """Both finishes at once (final scrape, stop, collect: their waits for Prometheus overlap); then
    each one's host figures with its partner's service and k6 CPU counted as its own. Never raises,
    as ScenarioRun.finish."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish-slot2") as beside:
        second = beside.submit(runs[1].finish, overlapped)
        outcomes = (runs[0].finish(overlapped), second.result())
    return (
        _beside(outcomes[0], runs[0], runs[1]),
        _beside(outcomes[1], runs[1], runs[0]),
    )


def _beside(outcome: ScenarioOutcome, run: ScenarioRun, partner: ScenarioRun) -> ScenarioOutcome:
    partner_service = partner.usage.cpu_seconds if partner.usage else None
    partner_k6 = partner.k6_run.cpu_seconds if partner.k6_run else None
    host = interference.scenario_section(
        run.metered.window, run.handle, run.usage, run.unmetered, beside=(partner_service, partner_k6)
    )
    return replace(outcome, host=host)


def _k6_beside(runs: tuple[ScenarioRun, ScenarioRun]) -> None:
    """Each side's k6 run with its partner's k6 CPU beside it: both ran on k6's CPUs at once, so a
    side is k6-bound when the two together used most of them."""
    first, second = runs[0].k6_run, runs[1].k6_run
    if first is not None and second is not None:
        runs[0].k6_run = replace(first, beside_cpu_seconds=second.cpu_seconds)
        runs[1].k6_run = replace(second, beside_cpu_seconds=first.cpu_seconds)


def _first_failed(runs: tuple[ScenarioRun, ScenarioRun]) -> ScenarioRun | None:
    return next((run for run in runs if run.failure is not None), None)


def _fail_partner(runs: tuple[ScenarioRun, ScenarioRun], failed: ScenarioRun) -> None:
    """The other side fails with the pair: its numbers, if any, were not measured beside a partner."""
    assert failed.failure is not None
    for run in runs:
        if run.failure is None:
            run.failure = ScenarioFailed(
                "duet", f"its partner {failed.scenario.id} failed in {failed.failure.phase}"
            )
