"""Scenario result files and the run manifest: where they are, how they are written and read."""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from labrunner.files import write_json_atomic
from labrunner.model.scenario import IDENTITY, Plan, Scenario
from labrunner.results.result import (
    BEFORE_SHAPES,
    BEFORE_STREAMS,
    BEFORE_UPLOADS,
    Result,
    ResultError,
    parse_result,
)

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
        "shape": scenario.shape,  # a result without it (written before shapes) is of cars
        "streams": scenario.streams,  # without it (written before connection models): 1
        "churn": scenario.churn,  # null: connections kept (so too without it, written before churn)
        "compression": scenario.compression,  # without it (written before compression): identity
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


def load_results(out_dir: Path, order: Sequence[str] = ()) -> list[Result]:
    """Every readable result of a run, parsed (result.parse_result): in `order` (scenario ids), then
    by start time."""
    results = []
    for path in (out_dir / "scenarios").glob("*.json"):
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and data.get("schema") == RESULT_SCHEMA:
                results.append(parse_result(data))
        except (OSError, ValueError, ResultError):
            continue  # unreadable results are rerun by --resume, never trusted
    position = {scenario_id: i for i, scenario_id in enumerate(order)}
    return sorted(results, key=lambda r: (position.get(r.scenario_id, len(position)), r.started_at))


@dataclass(frozen=True)
class Resumable:
    """What --resume finds in a run's scenarios/: the planned scenarios whose ok result it keeps, and
    the result files it does not trust (file name -> why): they run again, or are no part of the plan."""

    done: frozenset[str]
    ignored: Mapping[str, str]


def _load_model(scenario: Mapping[str, Any]) -> dict[str, Any]:
    return {key: scenario["load_model"].get(key) for key in ("name", "executor")}


# What a result must say as the plan does for --resume to keep it: which scenario it measured (a
# ladder rung's rate is set as it runs, so its load model is compared by name and executor).
_SAME: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "target": itemgetter("target"),
    "profile": itemgetter("profile"),
    "count": itemgetter("count"),
    "load model": _load_model,
    # A result written before directions or shapes: the parser's rules (results/result.py).
    "direction": lambda scenario: scenario.get("direction", BEFORE_UPLOADS),
    "shape": lambda scenario: scenario.get("shape", BEFORE_SHAPES),
    "streams": lambda scenario: scenario.get("streams", BEFORE_STREAMS),
    "churn": lambda scenario: scenario.get("churn"),
    "compression": lambda scenario: scenario.get("compression", IDENTITY),
}


def resumable(out_dir: Path, scenarios: Sequence[Scenario]) -> Resumable:
    """The ok results of `out_dir` that --resume may keep: each file's scenario must be the plan's
    scenario of that id (its id, target, profile, count, load model, direction, shape, streams, churn
    and compression as planned; a further repeat of a planned group, which --precision adds, as its
    group's), and the file must be named by that id; every other file is ignored, with why. A failed
    result is rerun, as a missing one is, and not named."""
    planned = {s.id: scenario_dict(s) for s in scenarios}
    done: set[str] = set()
    ignored: dict[str, str] = {}
    for path in sorted((out_dir / "scenarios").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            ignored[path.name] = f"unreadable ({type(exc).__name__})"
            continue
        if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
            ignored[path.name] = f"not a lab result (its schema is not {RESULT_SCHEMA})"
            continue
        if data.get("status") != "ok":
            continue
        if (why := _differs(path, data, planned)) is not None:
            ignored[path.name] = why
        else:
            done.add(path.stem)
    return Resumable(frozenset(done), ignored)


def _differs(path: Path, result: Mapping[str, Any], planned: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why a result is not the planned scenario its file is named for; None when it is."""
    scenario_id, scenario = result.get("scenario_id"), result.get("scenario")
    if scenario_id != path.stem:
        return f"it measured {scenario_id!r}, not the scenario its name says"
    if not isinstance(scenario, Mapping) or scenario.get("id") != scenario_id:
        return "its scenario section does not name it"
    # A block --precision added is a further repeat of a planned group: checked against the group's.
    plan = planned.get(path.stem) or next(
        (s for s in planned.values() if s["group"] == scenario.get("group")), None
    )
    if plan is None:
        return "no scenario of this plan has its id"
    for what, read in _SAME.items():
        try:
            ours, theirs = read(scenario), read(plan)
        except (KeyError, TypeError, AttributeError):
            return f"its scenario has no {what}"
        if ours != theirs:
            return f"its {what} is {_said(ours)}, the plan's {_said(theirs)}"
    return None


def _said(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


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


class ManifestError(ValueError):
    """A manifest.json the lab did not write, or that something changed since: said in one line."""


# The sections of a manifest the runner reads back (--resume), each with the JSON type it must have.
_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "run_id": str,
    "complete": bool,
    "started_at": str,
    "resumed_at": list,
    "resumed_by": list,
    "methodology": int,
    "matrix": dict,
    "calibration": dict,
    "not_run": dict,
}
_MATRIX_TYPES: dict[str, type | tuple[type, ...]] = {
    "preset": (str, type(None)),
    "seed": int,
    "run_order": list,
    "scenarios": list,
}
_JSON_NAMES = {
    str: "a string",
    bool: "true or false",
    int: "a whole number",
    list: "a list",
    dict: "an object",
}


def checked_manifest(run_dir: Path) -> dict[str, Any]:
    """A run's manifest.json when it is one the lab wrote, {} when there is none; ManifestError
    naming the file and what is wrong when it is unreadable or a section has the wrong type."""
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} holds {type(data).__name__}, not a manifest's object")
    if data.get("schema", MANIFEST_SCHEMA) != MANIFEST_SCHEMA:  # written by hand (tests): none
        raise ManifestError(
            f"{path} is not a lab manifest (schema {data.get('schema')!r}, not {MANIFEST_SCHEMA})"
        )
    _check_types(path, "", data, _MANIFEST_TYPES)
    _check_types(path, "matrix.", data.get("matrix", {}), _MATRIX_TYPES)
    return data


def _check_types(
    path: Path, where: str, section: Mapping[str, Any], types: Mapping[str, type | tuple[type, ...]]
) -> None:
    for key, kind in types.items():
        if key not in section:
            continue
        value = section[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            wanted = " or ".join(_JSON_NAMES.get(k, "null") for k in kinds)
            raise ManifestError(f"{path}: {where}{key} is {json.dumps(value)}, not {wanted}")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """A run's manifest.json; empty when it is missing or unreadable."""
    try:
        data = json.loads((run_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
