"""Scenario windows as InfluxDB points, so Grafana can mark them without the Grafana API.

Measurement `protolab_scenario` (docs/CONTRACTS.md): tags run, scenario, target,
protocol, profile (the k6 tag values); string fields event ("start"/"end") and text.
"""

import time
import urllib.error
import urllib.parse
import urllib.request

from labrunner.model.scenario import Scenario
from labrunner.observe import influx_auth
from labrunner.observe.labels import INFLUXDB_DATABASE, scenario_labels

MEASUREMENT = "protolab_scenario"


def _escape_tag(value: str) -> str:
    # Line protocol: commas, spaces and equals signs in tag values need a backslash.
    return value.replace("\\", "\\\\").replace(",", "\\,").replace(" ", "\\ ").replace("=", "\\=")


def _escape_string_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def line(run_id: str, scenario: Scenario, event: str, text: str, time_ns: int) -> str:
    """One line-protocol point for a scenario event."""
    tags = scenario_labels(run_id, scenario)
    tag_text = ",".join(f"{k}={_escape_tag(v)}" for k, v in tags.items())
    fields = f'event="{_escape_string_field(event)}",text="{_escape_string_field(text)}"'
    return f"{MEASUREMENT},{tag_text} {fields} {time_ns}"


def mark(influxdb_url: str, run_id: str, scenario: Scenario, event: str) -> str | None:
    """Write the point now; returns an error message instead of raising (a mark is not a result)."""
    point = line(run_id, scenario, event, f"{scenario.id} {event}", time.time_ns())
    query = urllib.parse.urlencode({"db": INFLUXDB_DATABASE, "precision": "ns"})
    url = f"{influxdb_url.rstrip('/')}/write?{query}"
    request = urllib.request.Request(url, data=point.encode(), method="POST")
    if credentials := influx_auth.writer():
        request.add_header("Authorization", credentials.basic())
    try:
        with urllib.request.urlopen(request, timeout=5):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return f"could not write the {event} annotation to {influxdb_url}: {exc}"
