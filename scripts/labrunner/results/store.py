"""Scenario result files and the run manifest: where they are, how they are written and read."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from labrunner.files import write_json_atomic
from labrunner.model.scenario import Plan, Scenario

RESULT_SCHEMA = "protolab.result/1"
MANIFEST_SCHEMA = "protolab.manifest/1"
MANIFEST_FILE = "manifest.json"


def result_path(out_dir: Path, scenario_id: str) -> Path:
    return out_dir / "scenarios" / f"{scenario_id}.json"


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """A scenario as plain data, for the manifest and each result."""
    target, profile, model = scenario.target, scenario.profile, scenario.load_model
    return {
        "id": scenario.id,
        "group": scenario.group,
        # The group without a duet's partner (model.duet): the target under these conditions.
        "target_group": scenario.target_group,
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
        "direction": scenario.direction,
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
            # A ladder's rung: its share of the target's closed-model req/s in the run (its rate's source).
            **({"share": model.rung.share} if model.rung else {}),
        },
        "duration_s": scenario.duration_s,
        "measured_s": scenario.measured_seconds,
        "warmup_s": scenario.warmup_s,
        "repeat": scenario.repeat,
        "repeats": scenario.repeats,
        # Set only when k6 may split (results of one k6 keep their keys); the k6 section's
        # "instances" says how many ran.
        **({"k6_instances": scenario.k6_instances} if scenario.k6_instances != 1 else {}),
        # Measured beside a partner: its target, this scenario's side of the pair and slot in the block.
        **({"duet": asdict(scenario.duet)} if scenario.duet is not None else {}),
    }


def write_result(out_dir: Path, result: Mapping[str, Any]) -> Path:
    """Write one scenario's result (record.build_result) where load_results finds it."""
    path = result_path(out_dir, result["scenario_id"])
    write_json_atomic(path, result)
    return path


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
    not_run: Mapping[str, str] | None = None,
    precision: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """manifest.json: what was run, from which code, with which tools, on which host; not_run: the
    scenarios this session did not run (ladder rungs over their target's capacity), each with why."""
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
        "not_run": dict(not_run or {}),
        # --precision: its target, budget, the scenarios it added and each compared pair's interval.
        "precision": dict(precision) if precision is not None else None,
        "matrix": {
            "path": str(plan.matrix_path),
            "text": plan.matrix_path.read_text(),
            "preset": plan.preset,
            "start_timeout_s": plan.start_timeout_s,
            "stop_timeout_s": plan.stop_timeout_s,
            # The order runs with: each round shuffled by the seed (--resume takes it from here).
            "seed": plan.seed,
            "run_order": [s.id for s in plan.run_order],
            # In the matrix's order, the order the summaries and the report read the run in.
            "scenarios": [scenario_dict(s) for s in plan.scenarios],
        },
    }


def not_run_of(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The scenarios a run did not run, with why (empty for runs written before ladders)."""
    return dict(manifest.get("not_run") or {})


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """A run's manifest.json; empty when it is missing or unreadable."""
    try:
        data = json.loads((run_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
