"""Preset caller's results: one JSON per measurement in results/<run>/callers/, and the run's manifest
there (docs/caller.md); a measurement's figures and its verdict (results.trust) computed once, here."""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from labrunner.files import write_json_atomic
from labrunner.observe.interference import others_share
from labrunner.results.trust import caller_lower_bound, caller_suspect
from labrunner.run.callers import CallerOutcome, Measurement

CALLER_SCHEMA = "protolab.caller/1"
CALLER_MANIFEST_SCHEMA = "protolab.caller-manifest/1"
CALLERS_DIR = "callers"
MANIFEST_FILE = "manifest.json"


def is_caller_run(run_dir: Path) -> bool:
    return (run_dir / CALLERS_DIR / MANIFEST_FILE).is_file()


def build_result(
    outcome: CallerOutcome, expected_checksum: int, started_at: datetime, finished_at: datetime
) -> dict[str, Any]:
    """A measurement's result: what ran, what its verification found against the pool's checksum, its
    window, the figures derived from it and its verdict."""
    m = outcome.measurement
    s = m.scenario
    window = outcome.measured or {}
    figures = _figures(outcome, window) if outcome.ok else {}
    found = (outcome.ready or {}).get("checksum")
    equal_work = found == expected_checksum
    error = outcome.error
    if outcome.ok and not equal_work:
        error = f"verified checksum {found}, the pool's {expected_checksum}: not the same work"
    errors = window.get("errors")
    error_rate = errors / window["calls"] if errors is not None and window.get("calls") else None
    return {
        "schema": CALLER_SCHEMA,
        "id": m.id,
        "group": m.group,
        "status": "ok" if error is None else "failed",
        "error": error,
        "caller": {
            "variant": m.variant,
            "client": m.client,
            "module": m.module,
            "cpus": list(outcome.caller_cpus),
            "profile": {
                "name": s.profile.name,
                "cpus": s.profile.cpus,
                "memory_bytes": s.profile.memory_bytes,
            },
            "concurrency": m.concurrency,
        },
        "target": {
            "name": s.target.name,
            "service": s.target.service,
            "protocol": s.target.protocol,
            "tls": s.target.tls,
            "response_model": s.response_model,
        },
        "count": s.count,
        "direction": s.direction,
        "repeat": s.repeat,
        "repeats": s.repeats,
        "warmup_s": s.warmup_s,
        "duration_s": s.duration_s,
        "verified": {"checksum": found, "expected_checksum": expected_checksum, "equal_work": equal_work},
        "window": {k: v for k, v in window.items() if k != "event"},
        "figures": figures,
        "lower_bound": caller_lower_bound(figures.get("server_cpu_share"), figures.get("quota_share"))
        if figures
        else None,
        "suspect": caller_suspect(figures.get("others_share"), figures.get("steal_share"), error_rate)
        if figures
        else [],
        "exit_code": outcome.exit_code,
        "log_tail": outcome.log_tail if error is not None else "",
        "started_at": started_at.isoformat(),
        "finished_at": finished_at.isoformat(),
    }


def _figures(outcome: CallerOutcome, window: Mapping[str, Any]) -> dict[str, float | None]:
    """Per call and per record, the caller's CPU; its calls/s, user share and share of its quota; the
    server's CPU as a share of its quota and per call; what others and steal took of the caller's CPUs."""
    s = outcome.measurement.scenario
    calls, seconds, cpu = window["calls"], window["seconds"], window.get("cpu_seconds")
    user = window.get("user_seconds")
    system = window.get("system_seconds")
    server = outcome.server_cpu_seconds
    figures: dict[str, float | None] = {
        "calls_per_s": calls / seconds,
        "cpu_per_call_us": cpu / calls * 1e6 if cpu is not None and calls else None,
        "cpu_per_record_us": cpu / (calls * s.count) * 1e6 if cpu is not None and calls else None,
        "user_share": user / (user + system)
        if user is not None and system is not None and user + system
        else None,
        "quota_share": cpu / (seconds * s.profile.cpus) if cpu is not None else None,
        "server_cpu_share": server / (seconds * outcome.server_cpu_limit)
        if server is not None and outcome.server_cpu_limit
        else None,
        "server_cpu_per_call_us": server / calls * 1e6 if server is not None and calls else None,
        "others_share": None,
        "steal_share": None,
    }
    before, after = outcome.host_before, outcome.host_after
    if before is not None and after is not None and cpu is not None and before.cpus:
        capacity = (after.at - before.at) * len(before.cpus)
        steal = sum(after.cpus[c].steal - before.cpus[c].steal for c in before.cpus if c in after.cpus)
        figures["others_share"] = others_share(before, after, cpu)
        figures["steal_share"] = steal / capacity if capacity > 0 else None
    return figures


def result_path(run_dir: Path, measurement: Measurement) -> Path:
    return run_dir / CALLERS_DIR / f"{measurement.id}.json"


def write_result(run_dir: Path, measurement: Measurement, result: Mapping[str, Any]) -> Path:
    path = result_path(run_dir, measurement)
    write_json_atomic(path, result)
    return path


def load_results(run_dir: Path, order: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A caller run's readable results, in `order` (measurement ids), then by start time."""
    results = []
    for path in (run_dir / CALLERS_DIR).glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("schema") == CALLER_SCHEMA:
            results.append(data)
    # Keyed for lookups by a result's id, which a foreign file may lack (None).
    position: dict[str | None, int] = {measurement_id: i for i, measurement_id in enumerate(order)}
    return sorted(results, key=lambda r: (position.get(r.get("id"), len(position)), r.get("started_at", "")))


def build_manifest(
    *,
    run_id: str,
    preset: str,
    planned: Sequence[Measurement],
    run_order: Sequence[Measurement],
    seed: int,
    provenance: Mapping[str, Any],
    argv: Sequence[str],
    started_at: datetime,
) -> dict[str, Any]:
    """The caller run's manifest: what was planned and in which order, from which code, on which host;
    the run sets its server's CPUs once they run and when it finished."""
    return {
        "schema": CALLER_MANIFEST_SCHEMA,
        "run_id": run_id,
        "preset": preset,
        "started_at": started_at.isoformat(),
        "finished_at": None,
        "argv": list(argv),
        **provenance,
        "seed": seed,
        "server_cpus": [],
        "measurements": [m.id for m in planned],
        "run_order": [m.id for m in run_order],
    }


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    write_json_atomic(run_dir / CALLERS_DIR / MANIFEST_FILE, manifest)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / CALLERS_DIR / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
