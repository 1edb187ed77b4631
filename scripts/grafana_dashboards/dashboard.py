"""The frame around a dashboard's panels: its template variables, annotations and links."""

import copy

from grafana_dashboards.panels import Panel, layout
from grafana_dashboards.queries import INFLUX_FILTER, INFLUXDB, PROMETHEUS, Datasource, Json

# The Grafana that docker-compose.yml runs and the schemaVersion it writes for classic dashboards:
# 42, DASHBOARD_SCHEMA_VERSION in grafana/grafana public/app/features/dashboard/state/DashboardMigrator.ts
# ("the FINAL version for the v1 dashboard API"). tests/unit/test_dashboards.py fails when compose's
# Grafana changes and these do not.
SCHEMA_VERSION = 42
GRAFANA_VERSION = "12.4.3"

VARIABLES = ("run", "target", "profile", "connections", "churn", "compression", "scenario")
# A variable whose "All" matches every series, those without its label too: runs made before the
# runner labelled connection models, churn and compression have none.
ALL_MATCHES_ANY = ("connections", "churn", "compression")


def _variable(name: str, source: Datasource, query: str) -> Json:
    single = name == "run"
    return {
        "name": name,
        "label": name.capitalize(),
        "type": "query",
        "datasource": source.ref(),
        "query": query,
        "definition": query,
        # On time range change, so a new run shows up without a reload.
        "refresh": 2,
        "regex": "",
        # The runner's run ids start with a UTC timestamp: descending puts the latest run first,
        # which Grafana selects by default.
        "sort": 2 if single else 1,
        "multi": not single,
        "includeAll": not single,
        **({"allValue": ".*"} if name in ALL_MATCHES_ANY else {}),
        "current": {} if single else {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "skipUrlSync": False,
    }


def influx_variables(measurement: str) -> list[Json]:
    """VARIABLES from the tags of a k6 measurement, each narrowed by the ones before."""
    variables: list[Json] = []
    for i, name in enumerate(VARIABLES):
        where = " AND ".join(f'"{prev}" =~ /^${prev}$/' for prev in VARIABLES[:i])
        query = f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "{name}"' + (
            f" WHERE {where}" if where else ""
        )
        variables.append(_variable(name, INFLUXDB, query))
    return variables


def prom_variables(metric: str) -> list[Json]:
    """VARIABLES from the file_sd target labels of a metric, narrowed in order."""
    variables: list[Json] = []
    for i, name in enumerate(VARIABLES):
        matchers = ", ".join(
            f'{prev}="$run"' if prev == "run" else f'{prev}=~"${prev}"' for prev in VARIABLES[:i]
        )
        selector = f"{metric}{{{matchers}}}" if matchers else metric
        variables.append(_variable(name, PROMETHEUS, f"label_values({selector}, {name})"))
    return variables


# The runner writes two points per scenario into InfluxDB measurement protolab_scenario, at its
# start and at its end: tags run, scenario, target, protocol, profile, connections, churn and
# compression; string fields event ("start" or "end") and text.
SCENARIO_WINDOWS: Json = {
    "name": "Scenario windows",
    "datasource": INFLUXDB.ref(),
    "enable": True,
    "hide": False,
    "iconColor": "rgba(255, 152, 48, 1)",
    "query": (
        'SELECT "text", "event", "scenario", "target", "profile" FROM "protolab_scenario"'
        f" WHERE $timeFilter AND {INFLUX_FILTER}"
    ),
    "textColumn": "text",
    "tagsColumn": "event,scenario,target,profile",
}


def dashboard(uid: str, title: str, description: str, variables: list[Json], panels: list[Panel]) -> Json:
    return {
        "uid": uid,
        "id": None,
        "title": title,
        "description": description,
        "tags": ["protolab"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "refresh": "",
        "links": [
            {
                "type": "dashboards",
                "title": "protolab",
                "tags": ["protolab"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "annotations": {"list": [copy.deepcopy(SCENARIO_WINDOWS)]},
        "templating": {"list": variables},
        "panels": layout(panels),
    }
