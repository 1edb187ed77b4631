"""A run of the plan: the loop over its units (what --resume keeps, the calibrations, each scenario or
duet block, the ladder's rungs set from the closed results, --precision's rounds) and the manifest as
it goes. The other jobs of a session: finisher (each finish beside the next start), progress (the
lines), precision_rounds, resume (what is kept, when and by which code) and run_end."""

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from labrunner import interrupts
from labrunner.backends.base import Backend, BackendSettings, cpu_list
from labrunner.cli import grafana
from labrunner.cli.finisher import Scenarios
from labrunner.cli.precision_rounds import precision_record, sharpen
from labrunner.cli.progress import Progress
from labrunner.cli.resume import resumed, resumed_provenance, sessions
from labrunner.cli.run_end import close_backend, say_end, say_findings, write_last
from labrunner.cli.session_config import SessionConfig
from labrunner.files import write_json_atomic
from labrunner.model.scenario import Plan
from labrunner.report import precision
from labrunner.report.compare import group_results
from labrunner.results import ladder
from labrunner.results.result import Result
from labrunner.results.store import (
    MANIFEST_FILE,
    build_manifest,
    load_results,
    read_manifest,
)
from labrunner.run import calibration
from labrunner.run.speed_reference import REFERENCE_CPUS, SpeedReference
from labrunner.say import Say
from services.common import user_message


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
    wanted = _wants_reference(plan, backend)
    reference = SpeedReference(config.run.run_id, settings.logs_dir) if wanted else None
    if reference is not None:
        config = replace(config, run=replace(config.run, speed_reference=reference.read))
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
    progress = Progress(run_order, done, say)
    if len(to_run) > 1:
        say("each scenario's service stops while the next one starts: its result line may follow that start")
    scenarios = Scenarios(config, backend=backend, settings=settings, progress=progress, order=order, say=say)
    run_one, settle = scenarios.run_one, scenarios.settle
    interrupted = True
    closed_results: list[Result] | None = None  # read once, when the first rung comes
    sharpness: list[precision.Sharpness] = []  # --precision: each compared pair, once its rounds are done
    try:
        if run_order:
            calibrations["before"] = calibration.calibrate(
                calibration_cpus, "before", say, config.calibration_rounds, config.calibration_attempts
            )
            if reference is not None:
                # On the highest-numbered service CPU, which every profile's services have (split_cpus),
                # so that every window's service CPUs hold it.
                _start_reference(reference, calibration_cpus[-1:], say)
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
            added = sharpen(
                plan,
                config,
                order,
                run_unit=scenarios.run_unit,
                settle=settle,
                extend=progress.extend,
                say=say,
            )
            sharpness = precision.sharpness(group_results(load_results(out, order)))
            manifest_args["precision"] = precision_record(config, sharpness, len(added))
        if reference is not None:
            reference.stop()  # the calibration after the run measures the host alone
        if plan.scenarios:
            calibrations["after"] = calibration.calibrate(
                calibration_cpus, "after", say, config.calibration_rounds, config.calibration_attempts
            )
        interrupted = False
    finally:
        # A Ctrl-C from here on waits until the end of this block: the cleanup is never cut short.
        with interrupts.held():
            scenarios.shutdown()  # an interrupted run still stops the service finishing
            if reference is not None:
                reference.stop()
            close_backend(backend, run, say)
            manifest = build_manifest(
                **manifest_args,
                not_run=not_run,
                finished_at=datetime.now(UTC),
                complete=not interrupted,
                all_ok=None if interrupted else not scenarios.failed,
            )
            write_last(out, manifest, run.run_id, order, say)
    say_end(out, order, scenarios.failed, not_run, say)
    if config.precision is not None:
        say(precision.outcome(sharpness, config.precision))
    say_findings(out, order, plan.preset, say)
    if grafana_url := grafana.dashboard_url(read_manifest(out)):
        say(f"grafana: {grafana_url}")
    return not scenarios.failed


def _wants_reference(plan: Plan, backend: Backend) -> bool:
    """The preset asks for the speed reference, and the local backend runs the services on this host's
    CPUs (under docker the services' CPUs are the engine's)."""
    return plan.speed_reference and backend.name == "local"


def _start_reference(reference: SpeedReference, cpus: tuple[int, ...], say: Say) -> None:
    """Start the speed reference on the services' CPUs; a run without one says why, and goes on."""
    try:
        reference.start(cpus)
    except (OSError, RuntimeError) as exc:  # no cgroup (CgroupUnavailable), no process
        say(f"no speed reference: {exc}; the sweep's own costs carry the host's drift between blocks")
        return
    say(f"speed reference: the calibration unit at {REFERENCE_CPUS:g} of a CPU on CPU(s) {cpu_list(cpus)}")


def _manifest_args(plan: Plan, config: SessionConfig, backend: str) -> dict[str, Any]:
    """What every manifest of this session says, however far it got."""
    run, out = config.run, config.run.out_dir
    started_at, resumed = sessions(out, config.resume)
    return {
        "run_id": run.run_id,
        "plan": plan,
        "backend": {"name": backend, "reason": config.backend_reason},
        "provenance": resumed_provenance(out, config.resume, config.provenance, resumed),
        "argv": config.argv,
        "started_at": started_at,
        "resumed_at": resumed,
        "settings": {
            "out_dir": str(out),
            "influxdb_url": run.influxdb_url,
            "prometheus_targets_dir": str(run.targets_dir) if run.targets_dir else None,
            # --proto: the user's message, its compiled files' digest, how its records were made.
            "user_message": user.describe() if (user := user_message.installed()) is not None else None,
        },
    }
