"""A run of the plan: resume, calibrate, each scenario run, judged and written, progress, summaries,
the manifest, and at the end the serialization benchmark and the report."""

import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner.backends.base import Backend, BackendSettings
from labrunner.cli import grafana
from labrunner.files import write_json_atomic
from labrunner.model.scenario import Plan, Scenario
from labrunner.observe import interference, prometheus_sd
from labrunner.report import answers, findings, payload, serialization
from labrunner.report.build import PAYLOAD_FILE, SERIALIZATION_FILE, write_report
from labrunner.report.compare import group_results
from labrunner.report.summary import write_summaries
from labrunner.results import record, trust
from labrunner.results.store import (
    MANIFEST_FILE,
    build_manifest,
    completed_ok,
    load_results,
    read_manifest,
    write_result,
)
from labrunner.results.trust import Verdict
from labrunner.run import calibration
from labrunner.run.outcome import ScenarioOutcome
from labrunner.run.runner import Finishing, RunConfig, run_scenario
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


Judged = tuple[ScenarioOutcome, Verdict]


def run_plan(
    plan: Plan, config: SessionConfig, backend: Backend, settings: BackendSettings, say: Say
) -> bool:
    """Run every scenario not already done; True when all of them succeeded."""
    run = config.run
    out = run.out_dir
    order = [s.id for s in plan.scenarios]
    done = completed_ok(out) if config.resume else set()
    started_at, resumed = _sessions(out, config.resume)
    manifest_args: dict[str, Any] = {
        "run_id": run.run_id,
        "plan": plan,
        "backend": {"name": backend.name, "reason": config.backend_reason},
        "provenance": config.provenance,
        "argv": config.argv,
        "started_at": started_at,
        "resumed_at": resumed,
        "settings": {
            "out_dir": str(out),
            "influxdb_url": run.influxdb_url,
            "prometheus_targets_dir": str(run.targets_dir) if run.targets_dir else None,
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
        out / MANIFEST_FILE, build_manifest(**manifest_args, finished_at=None, complete=False, all_ok=None)
    )
    progress = _Progress(plan.scenarios, done, say)
    failed: list[str] = []
    finishing: list[tuple[int, Finishing[Judged]]] = []  # at most one: the previous scenario

    def keep(outcome: ScenarioOutcome) -> Judged:
        """Judge and write a scenario's result: in the background when its finish is."""
        verdict = trust.judge_outcome(outcome)
        write_result(out, record.build_result(outcome, verdict))
        write_summaries(out, run.run_id, order)
        return outcome, verdict

    def settle() -> None:
        """Wait for the previous scenario's finish and written result, and report it."""
        while finishing:
            index, previous = finishing[0]
            outcome, verdict = previous.result()
            progress.finished(index, outcome, verdict)
            if outcome.failure is not None:
                failed.append(outcome.scenario.id)
            finishing.pop(0)

    interrupted = True
    # A service stops while the next one starts and warms up, when the backend allows it.
    finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")
    overlap = finisher if backend.finishes_in_background else None
    try:
        for index, scenario in enumerate(plan.scenarios, start=1):
            if scenario.id in done:
                say(f"[{index}/{len(plan.scenarios)}] {scenario.id}: ok in an earlier session, skipped")
                continue
            progress.starting(index, scenario)
            last = index == len(plan.scenarios)  # nothing follows to overlap its finish
            current = run_scenario(
                scenario,
                run,
                backend,
                settings,
                say,
                then=keep,
                before_measure=settle,
                finish_in=None if last else overlap,
            )
            settle()  # when this scenario ended before its measured window
            finishing.append((index, current))
        settle()
        if plan.scenarios:
            calibrations["after"] = calibration.calibrate(calibration_cpus, "after", say)
        interrupted = False
    finally:
        finisher.shutdown(wait=True)  # an interrupted run still stops the service finishing
        try:
            settle()  # the scenario that was finishing keeps its result
        except Exception as exc:
            say(f"the last finished scenario's result could not be written: {type(exc).__name__}: {exc}")
        backend.close()
        if run.targets_dir is not None:
            prometheus_sd.delete_run(run.targets_dir, run.run_id)
        all_ok = not interrupted and not failed
        write_json_atomic(
            out / MANIFEST_FILE,
            build_manifest(
                **manifest_args,
                finished_at=datetime.now(UTC),
                complete=not interrupted,
                all_ok=all_ok if not interrupted else None,
            ),
        )
        write_summaries(out, run.run_id, order)  # CPU per request in the final calibration's units
    say(
        f"{len(plan.scenarios) - len(failed)} of {len(plan.scenarios)} scenarios ok"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nresults: {out}/summary.md"
    )
    say_findings(out, order, plan.preset, say)
    if grafana_url := grafana.dashboard_url(read_manifest(out)):
        say(f"grafana: {grafana_url}")
    return not failed


def say_findings(out_dir: Path, order: list[str], preset: str, say: Say) -> None:
    """The run's findings as plain lines, the same as summary.md's first section."""
    found = answers.for_run(group_results(load_results(out_dir, order)), preset)
    say(f"findings: {findings.CONFIDENCE_LINE}")
    for line in findings.plain(found) or [findings.NONE_YET.removeprefix("- ")]:
        say(f"  {line}")


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
        overhead = sum(self._overheads) / len(self._overheads) if self._overheads else ASSUMED_OVERHEAD_S
        eta = sum(s.warmup_s + s.measured_seconds + overhead for s in self._pending)
        self._say(
            f"[{index}/{self._total}] {scenario.id}: starting "
            f"(elapsed {_clock(time.monotonic() - self._began)}, ETA {_clock(eta)})"
        )

    def finished(self, index: int, outcome: ScenarioOutcome, verdict: Verdict) -> None:
        if outcome.scenario in self._pending:
            self._pending.remove(outcome.scenario)
        self._overheads.append(outcome.timings_s["overhead"])
        self._say(f"[{index}/{self._total}] {outcome.scenario.id}: {outcome_line(outcome, verdict)}")


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
