"""Prometheus file-based service discovery for the service under test, one file per scenario.

The file appears once the service is healthy (Prometheus picks it up during the warm-up)
and is deleted as soon as the service stops. Samples keep their labels in the TSDB after a
target disappears, so nothing is lost; a file left behind would only make Prometheus
scrape a dead port, or a later scenario's service that happened to get the same
ephemeral port, under the wrong labels. delete_run() clears whatever an interrupted
run left.
"""

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from labrunner.backends.base import ServiceHandle
from labrunner.files import write_json_atomic
from labrunner.model.scenario import Scenario
from labrunner.observe.labels import scenario_labels


def labels(run_id: str, scenario: Scenario) -> dict[str, str]:
    """The labels a scenario's series carry, the same as the k6 tags plus the service."""
    return scenario_labels(run_id, scenario) | {"service": scenario.target.service}


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


def wait_scraped(prometheus_url: str, run_id: str, scenario: Scenario, timeout_s: float = 15.0) -> str | None:
    """Wait until Prometheus has scraped the scenario's target successfully; a message if it has not.

    Without this a short scenario can end before Prometheus discovers its file (file_sd
    refresh plus a scrape interval), and its server-side series would be missing.
    """
    deadline = time.monotonic() + timeout_s
    url = f"{prometheus_url.rstrip('/')}/api/v1/targets?state=active"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                targets = json.load(response)["data"]["activeTargets"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            return f"could not ask Prometheus at {prometheus_url} for its targets: {exc}"
        wanted = {"run": run_id, "scenario": scenario.id}
        if any(
            target.get("health") == "up" and wanted.items() <= target.get("labels", {}).items()
            for target in targets
        ):
            return None
        if time.monotonic() > deadline:
            return f"Prometheus at {prometheus_url} did not scrape the service within {timeout_s:g} s"
        time.sleep(0.25)
