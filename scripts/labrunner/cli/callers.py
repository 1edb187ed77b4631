"""run_matrix.py for a caller plan (preset caller, docs/caller.md): the servers started once, each on a CPU
of its own; every measurement in rounds shuffled by the seed, its result written as it finishes; then the
report and the findings in the caller's words. Local backend, as root (each caller has its own cgroup).
"""

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner import backends, certs, interrupts
from labrunner.backends.base import (
    Backend,
    BackendSettings,
    BackendUnavailable,
    ScenarioFailed,
    ServiceHandle,
)
from labrunner.model.scenario import Plan, Scenario
from labrunner.model.schema import MatrixError
from labrunner.paths import REPO
from labrunner.report import callers as report
from labrunner.results import callers as stored
from labrunner.results import provenance
from labrunner.run.callers import (
    CallerOutcome,
    Measurement,
    measurements,
    pool_checksum,
    run_caller,
    run_order,
    server_scenario,
)
from labrunner.run.service_checks import verify, wait_healthy
from labrunner.say import Say

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def plan_measurements(plan: Plan) -> tuple[Measurement, ...]:
    """The plan's measurements; MatrixError naming a scenario no caller can measure."""
    try:
        return measurements(plan)
    except ValueError as exc:
        raise MatrixError(f"preset {plan.preset!r}: {exc}") from None


def describe(plan: Plan, seed: int) -> str:
    """--dry-run: the measurements in the order they would run."""
    order = run_order(plan_measurements(plan), seed)
    lines = [
        f"preset {plan.preset}: {len(order)} caller measurements (lab and floor), seed {seed}, in order:"
    ]
    lines += [f"  {m.id}  ({m.module} -> {m.scenario.target.name})" for m in order]
    return "\n".join(lines)


def run_callers(
    plan: Plan,
    *,
    run_id: str,
    out_dir: Path,
    certs_dir: Path,
    k6_binary: Path,
    argv: Sequence[str],
    say: Say,
) -> int:
    """Run every measurement of a seeded caller plan; the exit status run_matrix.py returns."""
    if os.geteuid() != 0:
        raise BackendUnavailable(
            f"preset {plan.preset!r} needs root: each caller runs in a cgroup of its own at its quota"
        )
    assert plan.seed is not None
    planned = plan_measurements(plan)
    order = run_order(planned, plan.seed)
    if any(m.scenario.target.tls for m in order) and certs.ensure_certs(certs_dir):
        say(f"generated TLS material in {certs_dir}")
    settings = BackendSettings(
        run_id=run_id,
        root=REPO,
        certs_dir=certs_dir.resolve(),
        logs_dir=out_dir / "logs",
        k6_binary=k6_binary,
        start_timeout_s=plan.start_timeout_s,
        stop_timeout_s=plan.stop_timeout_s,
    )
    manifest = stored.build_manifest(
        run_id=run_id,
        preset=plan.preset,
        planned=planned,
        run_order=order,
        seed=plan.seed,
        provenance=provenance.collect(REPO, k6_binary),
        argv=argv,
        started_at=datetime.now(UTC),
    )
    say(f"run {run_id}: {len(order)} caller measurements, out {out_dir}")
    say(f"order: each round shuffled by seed {plan.seed}")
    backend = backends.create("local", settings, say)
    all_ok = True
    interrupted = False
    try:
        with interrupts.first_one_ends_the_run():
            servers = _start_servers(backend, order, settings.certs_dir, plan.start_timeout_s, say)
            manifest["server_cpus"] = list(_server_cpus(servers))
            stored.write_manifest(out_dir, manifest)
            checksums = {count: pool_checksum(count) for count in {m.scenario.count for m in order}}
            for index, measurement in enumerate(order, start=1):
                result = _measure(measurement, servers, checksums, settings, out_dir)
                all_ok &= result["status"] == "ok"
                say(f"[{index}/{len(order)}] {measurement.id}: {_progress(result)}")
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: the report covers the measurements that finished")
    finally:
        backend.close()  # stops every server still running
    manifest["finished_at"] = datetime.now(UTC).isoformat()
    stored.write_manifest(out_dir, manifest)
    md, page = report.write_report(out_dir)
    say(f"report: {md} and {page}")
    say("findings:")
    for line in report.terminal_findings(out_dir):
        say(f"  {line}")
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if all_ok else EXIT_FAILED


def _start_servers(
    backend: Backend, order: Sequence[Measurement], ca_dir: Path, timeout_s: float, say: Say
) -> dict[str, ServiceHandle | str]:
    """One server per target, each started, healthy and verified; a target whose server failed maps to
    why (its measurements fail with it)."""
    servers: dict[str, ServiceHandle | str] = {}
    scenarios: dict[str, Scenario] = {}
    for measurement in order:
        scenarios.setdefault(measurement.scenario.target.name, server_scenario(measurement.scenario))
    for name, scenario in scenarios.items():
        try:
            handle = backend.start_service(scenario)
        except ScenarioFailed as exc:
            servers[name] = f"the server did not start: {exc}"
            continue
        servers[name] = handle
        try:
            wait_healthy(backend, handle, scenario.target, ca_dir / certs.CA_FILE, timeout_s)
            checked = verify(handle, scenario, ca_dir / certs.CA_FILE)
        except ScenarioFailed as exc:
            checked = None
            servers[name] = f"the server is not healthy: {exc}"
        if checked is not None and not checked.ok:
            servers[name] = "the server failed its verification: " + "; ".join(checked.failures)
        if not isinstance(servers[name], ServiceHandle):
            backend.stop_service(handle)
            say(f"{name}: {servers[name]}")
        else:
            say(f"{name}: serving on {handle.address}, CPUs {handle.service_cpus}; callers: {handle.k6_cpus}")
    return servers


def _measure(
    measurement: Measurement,
    servers: Mapping[str, ServiceHandle | str],
    checksums: Mapping[int, int],
    settings: BackendSettings,
    out_dir: Path,
) -> dict[str, Any]:
    """One measurement run and its result written; a target without a server fails with why."""
    started = datetime.now(UTC)
    server = servers[measurement.scenario.target.name]
    if isinstance(server, ServiceHandle):
        outcome = run_caller(
            measurement,
            server,
            run_id=settings.run_id,
            ca_file=settings.certs_dir / certs.CA_FILE,
            log_file=settings.logs_dir / f"{measurement.id}.caller.log",
            start_timeout_s=settings.start_timeout_s,
        )
    else:
        outcome = CallerOutcome(measurement, (), error=server)
    result = stored.build_result(outcome, checksums[measurement.scenario.count], started, datetime.now(UTC))
    stored.write_result(out_dir, measurement, result)
    return result


def _progress(result: Mapping[str, Any]) -> str:
    """The progress line's figures: calls/s, CPU per call and its user share, the quota and the server's
    share of its CPU, and what qualifies them."""
    if result["status"] != "ok":
        return f"FAILED: {result['error']}"
    f = result["figures"]

    def shown(name: str, spec: str) -> str:
        return "?" if f[name] is None else spec.format(f[name])

    line = (
        f"{shown('calls_per_s', '{:,.0f}')} calls/s, {shown('cpu_per_call_us', '{:,.0f}')} µs CPU per call "
        f"(user {shown('user_share', '{:.0%}')}), caller quota {shown('quota_share', '{:.0%}')}, "
        f"server CPU {shown('server_cpu_share', '{:.0%}')}"
    )
    if result["lower_bound"]:
        line += f"; lower bound: {result['lower_bound']}"
    if result["suspect"]:
        line += "; suspect: " + "; ".join(result["suspect"])
    return line


def _server_cpus(servers: Mapping[str, ServiceHandle | str]) -> tuple[int, ...]:
    return next((h.service_cpus for h in servers.values() if isinstance(h, ServiceHandle)), ())
