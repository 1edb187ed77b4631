"""Where to see a docker run in Grafana: the matrix dashboard, on the run, over the run's time."""

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from labrunner.paths import REPO

DEFAULT_URL = "http://127.0.0.1:3000"  # where docker-compose.yml publishes Grafana
URL_VARIABLE = "GRAFANA_URL"  # a Grafana elsewhere (the dashboards imported into it)
DASHBOARD = REPO / "grafana" / "dashboards" / "matrix.json"
RUN_VARIABLE = "run"  # the dashboard's template variable that selects a run


def dashboard_url(manifest: Mapping[str, Any], base: str | None = None) -> str | None:
    """The dashboard URL for a docker run's manifest, with its run and time range; None for
    another backend's run (no lab Grafana shows it) or a manifest without a start."""
    if (manifest.get("backend") or {}).get("name") != "docker" or not manifest.get("started_at"):
        return None
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["name"] for v in dashboard.get("templating", {}).get("list", [])]
    if RUN_VARIABLE not in variables:
        raise ValueError(f"{DASHBOARD} has no {RUN_VARIABLE!r} variable (it has {variables})")
    started = datetime.fromisoformat(manifest["started_at"])
    finished = (
        datetime.fromisoformat(manifest["finished_at"]) if manifest.get("finished_at") else datetime.now(UTC)
    )
    query = urlencode({f"var-{RUN_VARIABLE}": manifest["run_id"], "from": _ms(started), "to": _ms(finished)})
    root = (base or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")
    return f"{root}/d/{dashboard['uid']}?{query}"


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)
