"""Scenario result files, the run manifest and the summary tables, each written atomically."""

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labrunner.backends.base import ScenarioFailed, ServiceHandle, ServiceUsage, cpu_list
from labrunner.model.scenario import Plan, Scenario
from labrunner.observe import interference
from labrunner.report.repeats import across_repeats_markdown
from labrunner.results.bounds import CLOSED_EXECUTORS, K6_SATURATED, SERVICE_CPU_BOUND
from labrunner.run import calibration
from labrunner.run.k6 import K6Run

if TYPE_CHECKING:  # verify imports the generated gRPC stubs; summaries do not need them
    from labrunner.run.service_checks import Verification

RESULT_SCHEMA = "protolab.result/1"
MANIFEST_SCHEMA = "protolab.manifest/1"
MAX_ERROR_RATE = 0.01
SUMMARY_COLUMNS = (
    "scenario",
    "status",
    "target",
    "service",
    "protocol",
    "tls",
    "profile",
    "cpus",
    "memory_mib",
    "count",
    "load_model",
    "repeat",
    "requests",
    "requests_per_s",
    "errors",
    "error_rate",
    "latency_avg_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "received_bytes",
    "received_bytes_per_request",
    "dropped_iterations",
    "service_cpu_s",
    "service_cpu_utilisation",
    "throttled_periods",
    "throttled_s",
    "memory_peak_mib",
    "k6_cpu_utilisation",
    "others_service_cpus_share",
    "others_k6_cpus_share",
    "relay_k6_cpus_share",  # of others on k6's CPUs: the userspace link emulator
    "steal_share",
    "service_cpu_per_request_cal",
    "protocol_verified",
    "overhead_s",
    "suspect",
    "failure",
)


@dataclass(frozen=True)
class Outcome:
    """Everything one scenario produced; the result JSON is derived from it."""

    run_id: str
    backend: str
    scenario: Scenario
    started_at: datetime
    finished_at: datetime
    failure: ScenarioFailed | None
    handle: ServiceHandle | None
    verification: "Verification | None"
    k6_run: K6Run | None
    usage: ServiceUsage | None
    timings_s: Mapping[str, float]
    host: Mapping[str, Any] | None = None  # interference.interference(): others on the scenario's CPUs


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON so readers see the old file or the new one, never a partial one."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # a crash after replace must not leave an empty file
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are read by other tools
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def result_path(out_dir: Path, scenario_id: str) -> Path:
    return out_dir / "scenarios" / f"{scenario_id}.json"


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """A scenario as plain data, for the manifest and each result."""
    target, profile, model = scenario.target, scenario.profile, scenario.load_model
    return {
        "id": scenario.id,
        "group": scenario.group,
        "target": target.name,
        "service": target.service,
        "script": target.script,
        "protocol": target.protocol,
        "tls": target.tls,
        "expect_proto": target.expect_proto,
        "env": dict(target.env),
        "profile": {"name": profile.name, "cpus": profile.cpus, "memory_bytes": profile.memory_bytes},
        "count": scenario.count,
        "response_model": scenario.response_model,
        "network": asdict(scenario.network) | {"rtt_s": scenario.network.rtt_s},
        "load_model": {
            "name": model.name,
            "executor": model.executor,
            "vus": model.vus,
            "stages": [asdict(stage) for stage in model.stages],
            "rate": model.rate,
            "pre_allocated_vus": model.pre_allocated_vus,
            "max_vus": model.max_vus,
            "iterations": model.iterations,
            "search": asdict(model.search) if model.search else None,
        },
        "duration_s": scenario.duration_s,
        "measured_s": scenario.measured_seconds,
        "warmup_s": scenario.warmup_s,
        "repeat": scenario.repeat,
        "repeats": scenario.repeats,
        # Set only when k6 may split (results of one k6 keep their keys); the k6 section's
        # "instances" says how many ran.
        **({"k6_instances": scenario.k6_instances} if scenario.k6_instances != 1 else {}),
    }


def build_result(outcome: Outcome) -> dict[str, Any]:
    """The result JSON of one scenario (schema protolab.result/1)."""
    k6_section = _k6_section(outcome.k6_run)
    metrics = k6_section.get("metrics") if k6_section else None
    service = _service_section(outcome.handle, outcome.usage, metrics)
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
        "k6": k6_section,
        "service": service,
        "timings_s": dict(outcome.timings_s),
        "notes": list(outcome.handle.notes) if outcome.handle else [],
        "host": None if outcome.host is None else dict(outcome.host),
        # The profile, and for an emulated one the emulator and the link's measured RTT and rate.
        "network": {
            "profile": outcome.scenario.network.name,
            **((outcome.handle.network or {}) if outcome.handle else {}),
        },
        "suspect": _suspect(metrics, k6_section, service, outcome.scenario)
        + interference.suspect_reasons(outcome.host),
    }


def load_results(out_dir: Path, order: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every readable result of a run: in `order` (scenario ids), then by start time."""
    results = []
    for path in (out_dir / "scenarios").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable results are rerun by --resume, never trusted
        if isinstance(data, dict) and data.get("schema") == RESULT_SCHEMA:
            results.append(data)
    # Keyed for lookups by a result's scenario_id, which a foreign file may lack (None).
    position: dict[str | None, int] = {scenario_id: i for i, scenario_id in enumerate(order)}
    return sorted(
        results,
        key=lambda r: (position.get(r.get("scenario_id"), len(position)), r.get("started_at", "")),
    )


def completed_ok(out_dir: Path) -> set[str]:
    """Scenario ids whose result exists with status ok: what --resume skips."""
    return {r["scenario_id"] for r in load_results(out_dir) if r.get("status") == "ok"}


def summary_row(result: Mapping[str, Any], calibration_unit_s: float | None = None) -> dict[str, Any]:
    """One flat row of summary.csv from a result; calibration_unit_s: the run's calibration unit."""
    scenario = result["scenario"]
    metrics = (result.get("k6") or {}).get("metrics") or {}
    latency = metrics.get("latency_ms") or {}
    usage = (result.get("service") or {}).get("usage") or {}
    verification = result.get("verification") or {}
    failure = result.get("failure") or {}
    timings = result.get("timings_s") or {}
    requests = metrics.get("requests")
    received = metrics.get("data_received_bytes")
    cpu_seconds = usage.get("cpu_seconds")
    section = result.get("host")
    return {
        "scenario": result["scenario_id"],
        "status": result["status"],
        "target": scenario["target"],
        "service": scenario["service"],
        "protocol": scenario["protocol"],
        "tls": scenario["tls"],
        "profile": scenario["profile"]["name"],
        "cpus": scenario["profile"]["cpus"],
        "memory_mib": scenario["profile"]["memory_bytes"] / 2**20,
        "count": scenario["count"],
        # Results written before the response models existed name none.
        "response_model": scenario.get("response_model", ""),
        "load_model": scenario["load_model"]["name"],
        "repeat": scenario["repeat"],
        "requests": requests,
        "requests_per_s": metrics.get("requests_per_second"),
        "errors": metrics.get("errors"),
        "error_rate": metrics.get("error_rate"),
        **{f"latency_{k}_ms": latency.get(k) for k in ("avg", "p50", "p90", "p95", "p99", "max")},
        "received_bytes": received,
        "received_bytes_per_request": received / requests if requests and received is not None else None,
        "dropped_iterations": metrics.get("dropped_iterations"),
        "service_cpu_s": usage.get("cpu_seconds"),
        "service_cpu_utilisation": usage.get("cpu_utilisation"),
        "throttled_periods": usage.get("throttled_periods"),
        "throttled_s": usage.get("throttled_seconds"),
        "memory_peak_mib": _mib(usage.get("memory_peak_bytes")),
        "k6_cpu_utilisation": (result.get("k6") or {}).get("cpu_utilisation"),
        "others_service_cpus_share": interference.share(section, "service_cpus"),
        "others_k6_cpus_share": interference.share(section, "k6_cpus"),
        "relay_k6_cpus_share": interference.relay_share(section),
        "steal_share": (section or {}).get("steal_share"),
        # Service CPU per request over the calibration's CPU per unit: comparable across CPU models.
        "service_cpu_per_request_cal": cpu_seconds / requests / calibration_unit_s
        if cpu_seconds is not None and requests and calibration_unit_s
        else None,
        "protocol_verified": verification.get("protocol") if verification.get("ok") else None,
        "overhead_s": timings.get("overhead"),
        "suspect": "; ".join(result.get("suspect") or []),
        "failure": f"{failure['phase']}: {failure['message']}" if failure else "",
    }


def write_summaries(out_dir: Path, run_id: str, order: Sequence[str] = ()) -> None:
    """Regenerate summary.csv and summary.md from every result file of the run."""
    unit = calibration.unit_seconds(_read_manifest(out_dir).get("calibration"))
    results = load_results(out_dir, order)
    rows = [summary_row(r, unit) for r in results]
    write_text_atomic(out_dir / "summary.csv", summary_csv(rows))
    across = "".join(f"\n{line}" for line in across_repeats_markdown(results))
    write_text_atomic(out_dir / "summary.md", summary_markdown(run_id, rows) + across)


def summary_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in SUMMARY_COLUMNS})
    return buffer.getvalue()


def summary_markdown(run_id: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """A readable table: throughput, latency, and what the service and k6 cost."""
    ok = sum(1 for r in rows if r["status"] == "ok")
    lines = [
        f"# protolab run {run_id}",
        "",
        f"{ok} of {len(rows)} scenarios ok. Latency of successful requests in ms; CPU "
        "utilisation is the share of the profile's quota (service) or of k6's own CPUs. Others: "
        "the share of the service's / k6's CPUs that processes outside the scenario used during "
        f"the measured window (suspect above {interference.SUSPECT_SHARE:.0%}; relay: the "
        "userspace link emulator's part of it on k6's CPUs). CPU/req cal: "
        "the service's CPU time per request in units of the run's calibration workload.",
        "",
        "| scenario | response model | status | req/s | errors | p50 | p90 | p99 | max | service CPU | "
        "throttled s | peak MiB | k6 CPU | others | steal | CPU/req cal | protocol |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        cells = [
            r["scenario"],
            r["response_model"] or "-",
            r["status"],
            _fmt(r["requests_per_s"], "{:.1f}"),
            _fmt(r["errors"], "{}"),
            *(_fmt(r[f"latency_{k}_ms"], "{:.2f}") for k in ("p50", "p90", "p99", "max")),
            _fmt(r["service_cpu_utilisation"], "{:.0%}"),
            _fmt(r["throttled_s"], "{:.2f}"),
            _fmt(r["memory_peak_mib"], "{:.0f}"),
            _fmt(r["k6_cpu_utilisation"], "{:.0%}"),
            _others(r["others_service_cpus_share"], r["others_k6_cpus_share"], r.get("relay_k6_cpus_share")),
            _fmt(r["steal_share"], "{:.1%}"),
            _fmt(r["service_cpu_per_request_cal"], "{:.3f}"),
            r["protocol_verified"] or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    problems = [r for r in rows if r["failure"] or r["suspect"]]
    if problems:
        lines += ["", "## Failures and suspect results", ""]
        lines += [f"- `{r['scenario']}`: {r['failure'] or r['suspect']}" for r in problems]
    return "\n".join(lines) + "\n"


def build_manifest(
    *,
    run_id: str,
    plan: Plan,
    backend: Mapping[str, str],
    provenance: Mapping[str, Any],
    argv: Sequence[str],
    started_at: datetime,
    finished_at: datetime | None,
    complete: bool,
    all_ok: bool | None,
    settings: Mapping[str, Any],
    resumed_at: Sequence[str] = (),
    calibration: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """manifest.json: what was run, from which code, with which tools, on which host."""
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "complete": complete,  # every scenario has a result and the run was not interrupted
        "all_ok": all_ok,
        "started_at": started_at.isoformat(),
        "finished_at": finished_at.isoformat() if finished_at else None,
        "resumed_at": list(resumed_at),
        "argv": list(argv),
        "backend": dict(backend),
        **provenance,
        "settings": dict(settings),
        # labrunner.run.calibration before the first scenario and after the last (this session's).
        "calibration": dict(calibration or {}),
        "matrix": {
            "path": str(plan.matrix_path),
            "text": plan.matrix_path.read_text(),
            "preset": plan.preset,
            "start_timeout_s": plan.start_timeout_s,
            "stop_timeout_s": plan.stop_timeout_s,
            "scenarios": [scenario_dict(s) for s in plan.scenarios],
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
        "cpu_utilisation": run.cpu_utilisation,
        "placement": run.placement,  # one k6 on another engine: where it ran
        "metrics": asdict(run.metrics) if run.metrics else None,
        # The full k6 metrics, for statistics nobody has asked for yet.
        "summary_metrics": summary.get("metrics"),
        "output_tail": run.output_tail,
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


def _service_section(
    handle: ServiceHandle | None, usage: ServiceUsage | None, metrics: Mapping[str, Any] | None
) -> dict[str, Any] | None:
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
        # The service idles while k6 starts up, so k6's load time is the fairer denominator.
        load_seconds = (metrics or {}).get("test_run_seconds") or usage.window_seconds
        section["usage"] = {
            **{k: v for k, v in asdict(usage).items() if k != "log_tail"},
            "cpu_utilisation": _utilisation(usage.cpu_seconds, usage.cpu_limit_cores, load_seconds),
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


def _suspect(
    metrics: Mapping[str, Any] | None,
    k6_section: Mapping[str, Any] | None,
    service: Mapping[str, Any] | None,
    scenario: Scenario,
) -> list[str]:
    """Reasons not to trust a measured number as the service's capacity."""
    reasons = []
    model = scenario.load_model
    k6_cpu = (k6_section or {}).get("cpu_utilisation")
    instances = (k6_section or {}).get("instances") or []
    for instance in instances:  # k6 split: any saturated instance limited the load it was given
        share = instance["cpu_utilisation"]
        if share is not None and share > K6_SATURATED:
            reasons.append(
                f"k6 instance {instance['index']} of {len(instances)} used {share:.0%} of its CPU "
                f"{cpu_list(instance['cpus'])} (load generator saturated)"
            )
    if not instances and k6_cpu is not None and k6_cpu > K6_SATURATED:
        reasons.append(f"k6 used {k6_cpu:.0%} of its CPUs (load generator saturated)")
    if metrics:
        # shared-iterations counts what the cap cut off as dropped: the reason below says it better.
        if metrics["dropped_iterations"] and model.iterations is None:
            reasons.append(f"{metrics['dropped_iterations']} iterations dropped")
        if metrics["error_rate"] is not None and metrics["error_rate"] > MAX_ERROR_RATE:
            reasons.append(f"error rate {metrics['error_rate']:.2%}")
        if model.iterations is not None and metrics["attempts"] < model.iterations:
            reasons.append(
                f"only {metrics['attempts']} of {model.iterations} requests within the "
                f"{scenario.duration_s:g}s cap"
            )
    utilisation = ((service or {}).get("usage") or {}).get("cpu_utilisation")
    closed = model.executor in CLOSED_EXECUTORS
    if metrics and closed and utilisation is not None and utilisation < SERVICE_CPU_BOUND:
        reasons.append(
            f"service used {utilisation:.0%} of its {scenario.profile.cpus:g}-CPU quota under a "
            "closed model: not CPU-bound, so something else limited throughput"
        )
    return reasons


def _utilisation(cpu_seconds: float | None, cores: float | None, seconds: float | None) -> float | None:
    if cpu_seconds is None or not cores or not seconds:
        return None
    return cpu_seconds / (cores * seconds)


def _others(service: float | None, k6: float | None, relay: float | None = None) -> str:
    """summary.md's others cell: "0.4% / 1.2%" (service's CPUs / k6's CPUs), and of k6's the
    userspace link emulator's part: "0.4% / 9.2% (relay 8.1%)"."""
    if service is None and k6 is None:
        return "-"
    of_which = f" (relay {relay:.1%})" if relay is not None else ""
    return f"{_fmt(service, '{:.1%}')} / {_fmt(k6, '{:.1%}')}{of_which}"


def _read_manifest(out_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((out_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mib(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def _fmt(value: object, spec: str) -> str:
    return "-" if value is None or value == "" else spec.format(value)
