"""summary.csv and summary.md: one row per scenario result, regenerated after every scenario."""

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labrunner.files import write_text_atomic
from labrunner.report.compare import group_results
from labrunner.report.findings import for_run, text
from labrunner.report.host_conditions import user_share
from labrunner.report.repeats import across_repeats_markdown
from labrunner.results.result import Result
from labrunner.results.store import load_results, not_run_of, read_manifest
from labrunner.results.trust import SUSPECT_SHARE, unexplained_spread, verdict_of
from labrunner.run import calibration

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
    "response_model",
    "direction",
    "load_model",
    "repeat",
    "network",
    "network_rtt_ms",  # measured on the emulated link before the service started; empty on loopback
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
    "service_user_cpu_share",  # user / (user + system): the rest of the service's CPU is the kernel's
    "throttled_periods",
    "throttled_s",
    "memory_peak_mib",
    "k6_cpu_utilisation",
    "k6_cpu_per_request_ms",  # k6's process CPU over successful requests: what the load costs k6
    "others_service_cpus_share",
    "others_k6_cpus_share",
    "relay_k6_cpus_share",  # of others on k6's CPUs: the userspace link emulator
    "steal_share",
    "service_cpu_per_request_cal",
    "service_cpu_per_request_kcal",  # in units of the kernel-bound calibration (loopback round trips)
    "protocol_verified",
    "overhead_s",
    "suspect",
    "failure",
)
# summary.md's Not run section, before its list.
NOT_RUN_LINE = (
    "A ladder rung offers its share of its target's closed-model req/s earlier in the run, and runs "
    "only where that req/s was measured (matrix.toml, [load_models.*.ladder]): no failure, and no result."
)


def summary_row(
    result: Result, calibration_unit_s: float | None = None, kernel_unit_s: float | None = None
) -> dict[str, Any]:
    """One flat row of summary.csv from a result; calibration_unit_s and kernel_unit_s: the run's
    CPU and kernel calibration units. Its columns are the ones the result model declares
    (result.columns())."""
    scenario, metrics, usage, host = result.scenario, result.metrics, result.usage, result.host
    latency = metrics.latency_ms if metrics else {}
    requests = metrics.requests if metrics else None
    received = metrics.data_received_bytes if metrics else None
    cpu_seconds = usage.cpu_seconds if usage else None
    rtt = result.network.measured_rtt_s
    k6_cpu_seconds = result.k6.cpu_seconds if result.k6 else None
    service_cpus, k6_cpus = (host.service_cpus, host.k6_cpus) if host else (None, None)
    return {
        "scenario": result.scenario_id,
        "status": result.status,
        "target": scenario.target,
        "service": scenario.service,
        "protocol": scenario.protocol,
        "tls": scenario.tls,
        "profile": scenario.profile.name,
        "cpus": scenario.profile.cpus,
        "memory_mib": scenario.profile.memory_bytes / 2**20,
        "count": scenario.count,
        "response_model": scenario.response_model,
        "direction": scenario.direction,
        "load_model": scenario.load_model.name,
        "repeat": scenario.repeat,
        "network": result.network.profile,
        "network_rtt_ms": rtt * 1000 if rtt is not None else None,
        "requests": requests,
        "requests_per_s": metrics.requests_per_second if metrics else None,
        "errors": metrics.errors if metrics else None,
        "error_rate": metrics.error_rate if metrics else None,
        **{f"latency_{k}_ms": latency.get(k) for k in ("avg", "p50", "p90", "p95", "p99", "max")},
        "received_bytes": received,
        "received_bytes_per_request": received / requests if requests and received is not None else None,
        "dropped_iterations": metrics.dropped_iterations if metrics else None,
        "service_cpu_s": cpu_seconds,
        "service_cpu_utilisation": usage.cpu_utilisation if usage else None,
        "service_user_cpu_share": user_share(usage) if usage else None,
        "throttled_periods": usage.throttled_periods if usage else None,
        "throttled_s": usage.throttled_seconds if usage else None,
        "memory_peak_mib": _mib(usage.memory_peak_bytes if usage else None),
        "k6_cpu_utilisation": result.k6.cpu_utilisation if result.k6 else None,
        "k6_cpu_per_request_ms": _in_units(k6_cpu_seconds, requests, 1 / 1000),
        "others_service_cpus_share": service_cpus.share if service_cpus else None,
        "others_k6_cpus_share": k6_cpus.share if k6_cpus else None,
        "relay_k6_cpus_share": k6_cpus.relay_share if k6_cpus else None,
        "steal_share": host.steal_share if host else None,
        # Service CPU per request over the calibration's CPU per unit: comparable across CPU models.
        "service_cpu_per_request_cal": _in_units(cpu_seconds, requests, calibration_unit_s),
        "service_cpu_per_request_kcal": _in_units(cpu_seconds, requests, kernel_unit_s),
        "protocol_verified": result.protocol_verified,
        "overhead_s": result.overhead_s,
        "suspect": "; ".join(verdict_of(result).suspect),
        "failure": str(result.failure or ""),
    }


def write_summaries(out_dir: Path, run_id: str, order: Sequence[str] = ()) -> None:
    """Regenerate summary.csv and summary.md (the findings first) from every result file of the run."""
    manifest = read_manifest(out_dir)
    found_calibration = manifest.get("calibration")
    unit = calibration.unit_seconds(found_calibration)
    kernel_unit = calibration.unit_seconds(found_calibration, "kernel")
    results = load_results(out_dir, order)
    rows = [summary_row(r, unit, kernel_unit) for r in results]
    write_text_atomic(out_dir / "summary.csv", summary_csv(rows))
    found = for_run(group_results(results), manifest.get("matrix", {}).get("preset"))
    across = "".join(f"\n{line}" for line in across_repeats_markdown(results))
    markdown = summary_markdown(
        run_id, rows, text.markdown_section(found), spread_notes(results), not_run_of(manifest)
    )
    write_text_atomic(out_dir / "summary.md", markdown + across)


def spread_notes(results: Sequence[Result]) -> list[str]:
    """One line per group whose repeats spread more than interference explains (trust.unexplained_spread)."""
    notes = []
    for g in group_results(results):
        if (spread := unexplained_spread(g.results)) is not None:
            notes.append(f"`{g.id}` ({len(g.results)} repeats): {spread.reason}")
    return notes


def summary_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in SUMMARY_COLUMNS})
    return buffer.getvalue()


def summary_markdown(
    run_id: str,
    rows: Sequence[Mapping[str, Any]],
    first: Sequence[str] = (),
    spreads: Sequence[str] = (),
    not_run: Mapping[str, str] | None = None,
) -> str:
    """A readable table: throughput, latency, and what the service and k6 cost; first: markdown lines
    between the title and the table (the findings); spreads: groups whose repeats spread unexplained;
    not_run: the scenarios the run did not run (ladder rungs over capacity), each with why."""
    ok = sum(1 for r in rows if r["status"] == "ok")
    skipped = f" {len(not_run)} not run (see Not run)." if not_run else ""
    lines = [
        f"# protolab run {run_id}",
        "",
        *first,
        "## Scenarios",
        "",
        f"{ok} of {len(rows)} scenarios ok.{skipped} Latency of successful requests in ms; CPU "
        "utilisation is the share of the profile's quota (service) or of k6's own CPUs. Others: "
        "the share of the service's / k6's CPUs that processes outside the scenario used during "
        f"the measured window (suspect above {SUSPECT_SHARE:.0%}; relay: the "
        "userspace link emulator's part of it on k6's CPUs). CPU/req cal and kcal: "
        "the service's CPU time per request in units of the run's CPU and kernel calibration "
        "workloads; user: the share of the service's CPU time spent in user space (the rest is "
        "the kernel's). k6 ms/req: k6's CPU time per successful request (its process, start-up "
        "included), what the load generator pays per request of the scenario's protocol.",
        "",
        "| scenario | response model | status | req/s | errors | p50 | p90 | p99 | max | service CPU | "
        "throttled s | peak MiB | k6 CPU | k6 ms/req | others | steal | CPU/req cal | CPU/req kcal | user | "
        "protocol |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
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
            _fmt(r.get("k6_cpu_per_request_ms"), "{:.3f}"),
            _others(r["others_service_cpus_share"], r["others_k6_cpus_share"], r.get("relay_k6_cpus_share")),
            _fmt(r["steal_share"], "{:.1%}"),
            _fmt(r["service_cpu_per_request_cal"], "{:.3f}"),
            _fmt(r["service_cpu_per_request_kcal"], "{:.3f}"),
            _fmt(r["service_user_cpu_share"], "{:.0%}"),
            r["protocol_verified"] or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    problems = [r for r in rows if r["failure"] or r["suspect"]]
    if problems or spreads:
        lines += ["", "## Failures and suspect results", ""]
        lines += [f"- `{r['scenario']}`: {r['failure'] or r['suspect']}" for r in problems]
        lines += [f"- {note}" for note in spreads]
    if not_run:
        lines += ["", "## Not run", "", NOT_RUN_LINE, ""]
        lines += [f"- `{scenario}`: {reason}" for scenario, reason in not_run.items()]
    return "\n".join(lines) + "\n"


def _in_units(cpu_seconds: float | None, requests: int | None, unit_s: float | None) -> float | None:
    return cpu_seconds / requests / unit_s if cpu_seconds is not None and requests and unit_s else None


def _others(service: float | None, k6: float | None, relay: float | None = None) -> str:
    """summary.md's others cell: "0.4% / 1.2%" (service's CPUs / k6's CPUs), and of k6's the
    userspace link emulator's part: "0.4% / 9.2% (relay 8.1%)"."""
    if service is None and k6 is None:
        return "-"
    of_which = f" (relay {relay:.1%})" if relay is not None else ""
    return f"{_fmt(service, '{:.1%}')} / {_fmt(k6, '{:.1%}')}{of_which}"


def _mib(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def _fmt(value: object, spec: str) -> str:
    return "-" if value is None or value == "" else spec.format(value)
