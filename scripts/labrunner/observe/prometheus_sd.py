"""Prometheus file-based service discovery for the service under test, one file per scenario.

The file appears once the service listens (Prometheus picks it up during the health checks,
verification and warm-up) and is deleted as soon as the service stops. Samples keep their
labels in the TSDB after a target disappears, so nothing is lost; a file left behind would
only make Prometheus scrape a dead port, or a later scenario's service that happened to get
the same ephemeral port, under the wrong labels. delete_run() clears whatever an interrupted
run left.
"""

import json
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from labrunner.backends.base import ServiceHandle
from labrunner.files import write_json_atomic
from labrunner.model.scenario import Scenario
from labrunner.observe.labels import scenario_labels

_POLL_S = 0.05  # the targets API answers at once; a scrape is due within an interval


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


def wait_scraped_after(
    prometheus_url: str, run_id: str, scenario: Scenario, after: float, timeout_s: float
) -> str | None:
    """Wait until a successful scrape of the scenario's target began at or after `after` (Unix time);
    a message if none did within timeout_s.

    The runner calls it once the measured window has ended: a scrape after the workers' last
    flush holds the scenario's final counters, which a stop before it would lose.
    """
    deadline = time.monotonic() + timeout_s
    url = f"{prometheus_url.rstrip('/')}/api/v1/targets?state=active"
    wanted = {"run": run_id, "scenario": scenario.id}
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                targets = json.load(response)["data"]["activeTargets"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            return f"could not ask Prometheus at {prometheus_url} for its targets: {exc}"
        ours = [t for t in targets if wanted.items() <= t.get("labels", {}).items()]
        if any(t.get("health") == "up" and _scraped_at(t) >= after for t in ours):
            return None
        if time.monotonic() > deadline:
            what = "scrape" if ours else "discover"
            return f"Prometheus at {prometheus_url} did not {what} the service {timeout_s:g} s after its end"
        time.sleep(_POLL_S)


def _scraped_at(target: dict[str, Any]) -> float:
    """When the target's last scrape began (Unix time); 0 before its first."""
    try:
        # Prometheus gives nanoseconds ("...:33.295566684Z"), more than fromisoformat reads.
        stamp = datetime.fromisoformat(target["lastScrape"][:26].rstrip("Z") + "+00:00")
    except (KeyError, TypeError, ValueError):
        return 0.0
    return stamp.timestamp()
