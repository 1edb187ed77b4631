"""Prometheus file-based service discovery for the service under test, one file per scenario.

The file appears once the service is healthy (Prometheus picks it up during the warm-up)
and is deleted as soon as the service stops. Samples keep their labels in the TSDB after a
target disappears, so nothing is lost; a file left behind would only make Prometheus
scrape a dead port, or a later scenario's service that happened to get the same
ephemeral port, under the wrong labels. delete_run() clears whatever an interrupted
run left.
"""

from pathlib import Path

from labrunner.backend import ServiceHandle
from labrunner.matrix import Scenario
from labrunner.results import write_json_atomic


def labels(run_id: str, scenario: Scenario) -> dict[str, str]:
    """The labels a scenario's series carry, the same as the k6 tags plus the service."""
    return {
        "run": run_id,
        "scenario": scenario.id,
        "target": scenario.target.name,
        "protocol": scenario.target.protocol,
        "profile": scenario.profile.name,
        "service": scenario.target.service,
    }


def file_for(targets_dir: Path, run_id: str, scenario: Scenario) -> Path:
    return targets_dir / f"{run_id}-{scenario.id}.json"


def write(targets_dir: Path, run_id: str, scenario: Scenario, handle: ServiceHandle) -> Path | None:
    """Write the scenario's file_sd JSON atomically; None when the service exposes no metrics."""
    if handle.prometheus_target is None:
        return None
    path = file_for(targets_dir, run_id, scenario)
    # Atomic: Prometheus watches the directory and must never read a half-written file.
    write_json_atomic(path, [{"targets": [handle.prometheus_target], "labels": labels(run_id, scenario)}])
    return path


def delete_run(targets_dir: Path, run_id: str) -> None:
    """Remove every file of the run (normally none are left)."""
    for path in targets_dir.glob(f"{run_id}-*.json"):
        path.unlink(missing_ok=True)
