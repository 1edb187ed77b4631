"""A scenario's result (schema protolab.result/1), assembled once from its outcome and verdict."""

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from labrunner.results.result import Result, parse_result
from labrunner.results.store import RESULT_SCHEMA, scenario_dict
from labrunner.results.trust import Verdict, figures_of, judge
from labrunner.run.k6.result import K6Run
from labrunner.run.outcome import ScenarioOutcome

if TYPE_CHECKING:  # service_checks imports the generated gRPC stubs; results do not need them
    from labrunner.run.service_checks import Verification


def build_result(outcome: ScenarioOutcome, verdict: Verdict) -> dict[str, Any]:
    """The result JSON of one scenario; verdict: judge_outcome(outcome)."""
    return _result(outcome, verdict)


def judge_outcome(outcome: ScenarioOutcome) -> Verdict:
    """The verdict on a scenario that just ran: judged from the result it stores (unjudged), as a
    stored one is (trust.verdict_of)."""
    return judge(figures_of(unjudged(outcome)))


def unjudged(outcome: ScenarioOutcome) -> Result:
    """The result of one scenario before its verdict: what judge_outcome judges, so a live outcome
    and a stored result are judged from the same typed figures."""
    return parse_result(_result(outcome, None))


def _result(outcome: ScenarioOutcome, verdict: Verdict | None) -> dict[str, Any]:
    failure = outcome.failure
    return {
        "schema": RESULT_SCHEMA,
        "run_id": outcome.run_id,
        "scenario_id": outcome.scenario.id,
        "status": "ok" if failure is None else "failed",
        "failure": None
        if failure is None
        else {"phase": failure.phase, "message": failure.message, "log_tail": failure.log_tail},
        "backend": outcome.backend,
        "started_at": outcome.started_at.isoformat(),
        "finished_at": outcome.finished_at.isoformat(),
        "scenario": scenario_dict(outcome.scenario),
        "verification": None if outcome.verification is None else _verification(outcome.verification),
        "k6": _k6_section(outcome.k6_run),
        "service": _service_section(outcome),
        "timings_s": {phase: round(seconds, 3) for phase, seconds in outcome.timings_s.items()},
        "notes": list(outcome.handle.notes) if outcome.handle else [],
        "host": None if outcome.host is None else dict(outcome.host),
        # The profile, and for an emulated one the emulator and the link's measured RTT and rate.
        "network": {
            "profile": outcome.scenario.network.name,
            **((outcome.handle.network or {}) if outcome.handle else {}),
            # The userspace link emulator's CPU time, on k6's CPUs.
            **(
                {"relay_cpu_s": round(outcome.relay_cpu_seconds, 4)}
                if outcome.relay_cpu_seconds is not None
                else {}
            ),
        },
        **({"suspect": list(verdict.suspect), "lower_bound": verdict.lower_bound} if verdict else {}),
        **({"capacity": outcome.search.as_dict()} if outcome.search is not None else {}),
        # k6's connections as the service's namespace counted them, against the plan's (run.connections),
        # and those k6 dialed in the measured window (a churn's every N calls).
        "connections": {
            "planned": outcome.scenario.connections,
            "seen": dict(outcome.connections_seen),
            "dialed": outcome.k6_run.metrics.connections_opened
            if outcome.k6_run is not None and outcome.k6_run.metrics is not None
            else None,
        },
    }


def _k6_section(run: K6Run | None) -> dict[str, Any] | None:
    if run is None:
        return None
    summary = run.summary or {}
    section = {
        "exit_code": run.exit_code,
        "wall_seconds": run.wall_seconds,
        "cpu_seconds": run.cpu_seconds,
        "cpus": run.cpus,
        "cpu_utilisation": run.cpu_utilisation,  # with a duet partner's k6 (beside_cpu_seconds)
        "placement": run.placement,  # one k6 on another engine: where it ran
        "metrics": asdict(run.metrics) if run.metrics else None,
        # The full k6 metrics, for statistics nobody has asked for yet.
        "summary_metrics": summary.get("metrics"),
        "output_tail": run.output_tail,
        # A duet partner's k6 CPU seconds on the same CPUs; results of a k6 alone keep their keys.
        **({"beside_cpu_seconds": run.beside_cpu_seconds} if run.beside_cpu_seconds is not None else {}),
        # An open model's latency in consecutive batches of its samples: n and the percentiles of each.
        **({"latency_batches": [dict(b) for b in run.latency_batches]} if run.latency_batches else {}),
    }
    if run.instances:
        # k6 split by execution segments: metrics above are merged (counts summed, latency over
        # every instance's raw samples), cpu_utilisation is the busiest instance's; each instance's own:
        section["instances"] = [
            {
                "index": index,
                "segment": instance.segment,
                "cpus": list(instance.cpu_ids),
                "placement": instance.placement,
                "exit_code": instance.exit_code,
                "wall_seconds": instance.wall_seconds,
                "cpu_seconds": instance.cpu_seconds,
                "cpu_utilisation": instance.cpu_utilisation,
                "latency_samples": None
                if instance.latency_samples is None
                else len(instance.latency_samples),
                "metrics": asdict(instance.metrics) if instance.metrics else None,
                "summary_metrics": (instance.summary or {}).get("metrics"),
                "output_tail": instance.output_tail,
            }
            for index, instance in enumerate(run.instances, start=1)
        ]
    return section


def _service_section(outcome: ScenarioOutcome) -> dict[str, Any] | None:
    handle, usage = outcome.handle, outcome.usage
    if handle is None:
        return None
    section: dict[str, Any] = {
        "workers": handle.workers,
        "limits": handle.limits,
        "service_cpus": list(handle.service_cpus),
        "k6_cpus": list(handle.k6_cpus),
        # k6 on other engines: what each k6_cpus entry is; their CPU numbers are not the service's.
        "k6_places": list(handle.k6_places),
        "cpus_shared_with_k6": not handle.k6_places and bool(set(handle.service_cpus) & set(handle.k6_cpus)),
        "address": str(handle.address),
        "prometheus_target": handle.prometheus_target,
        "network_path": handle.network_path,
        "interpreter": dict(handle.interpreter) if handle.interpreter else None,
        "usage": None,
        "log_tail": usage.log_tail if usage else "",
    }
    if usage is not None:
        section["usage"] = {
            **{k: v for k, v in asdict(usage).items() if k != "log_tail"},
            "cpu_utilisation": outcome.service_cpu_utilisation,
        }
    return section


def _verification(verification: "Verification") -> dict[str, Any]:
    return {
        "ok": verification.ok,
        "protocol": verification.protocol,
        "tls": verification.tls,
        "checks": list(verification.checks),
        "failures": list(verification.failures),
    }
