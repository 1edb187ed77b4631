"""A run directory as the report reads it: manifest, results in the run's order, and their groups."""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labrunner.report.compare import Group, group_results
from labrunner.results.result import Result
from labrunner.results.store import load_results, read_manifest


@dataclass(frozen=True)
class Run:
    """A run directory as the report reads it."""

    path: Path
    run_id: str
    manifest: Mapping[str, Any]  # empty when manifest.json is missing or unreadable
    results: tuple[Result, ...]
    groups: tuple[Group, ...]


def load_run(path: Path) -> Run:
    """Manifest and results of a run directory, results in the run's scenario order."""
    manifest = read_manifest(path)
    order = [s["id"] for s in manifest.get("matrix", {}).get("scenarios", [])]
    results = tuple(load_results(path, order))
    return Run(path, manifest.get("run_id", path.name), manifest, results, tuple(group_results(results)))


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
