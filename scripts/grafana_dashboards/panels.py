"""The panel kinds the dashboards use, and their layout in Grafana's grid."""

import json
from dataclasses import dataclass
from typing import Any

from grafana_dashboards.queries import Json

GRID_WIDTH = 24


@dataclass(frozen=True)
class Panel:
    """A panel and its width; positions and ids are assigned by layout()."""

    body: Json
    width: int = 12
    height: int = 8


def _panel(kind: str, title: str, description: str, targets: list[Json], **body: Any) -> Json:
    datasources = {json.dumps(t["datasource"], sort_keys=True) for t in targets}
    if len(datasources) != 1:
        raise ValueError(f"panel {title!r}: targets must share one datasource")
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "targets": [{"refId": chr(ord("A") + i), **t} for i, t in enumerate(targets)],
        **body,
    }


def _field_config(unit: str, overrides: list[Json] | None = None, **defaults: Any) -> Json:
    return {"defaults": {"unit": unit, **defaults}, "overrides": overrides or []}


def timeseries(
    title: str, description: str, targets: list[Json], unit: str = "short", width: int = 12
) -> Panel:
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "showPoints": "never",
        "spanNulls": False,
    }
    body = _panel(
        "timeseries",
        title,
        description,
        targets,
        fieldConfig=_field_config(unit, custom=custom),
        options={
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["mean", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )
    return Panel(body, width)


def _reduce(values: bool = False) -> Json:
    return {"values": values, "calcs": ["lastNotNull"], "fields": ""}


def stat(title: str, description: str, targets: list[Json], unit: str = "short", width: int = 6) -> Panel:
    options = {
        "reduceOptions": _reduce(),
        "colorMode": "value",
        "graphMode": "none",
        "textMode": "value_and_name",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return Panel(
        _panel("stat", title, description, targets, fieldConfig=_field_config(unit), options=options), width
    )


def bargauge(title: str, description: str, target: Json, unit: str, width: int = 12) -> Panel:
    """One bar per row of a table with one numeric column, named by the row's text columns."""
    options = {
        "reduceOptions": _reduce(values=True),
        "orientation": "horizontal",
        "displayMode": "gradient",
        "showUnfilled": True,
        "valueMode": "color",
        "namePlacement": "auto",
    }
    body = _panel(
        "bargauge", title, description, [target], fieldConfig=_field_config(unit, min=0), options=options
    )
    return Panel(body, width)


def table(
    title: str,
    description: str,
    targets: list[Json],
    *,
    transformations: list[Json],
    overrides: list[Json] | None = None,
    width: int = 24,
    height: int = 8,
) -> Panel:
    body = _panel(
        "table",
        title,
        description,
        targets,
        fieldConfig=_field_config("short", overrides),
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}},
        transformations=transformations,
    )
    return Panel(body, width, height)


def hide_columns(*names: str) -> Json:
    return {"id": "organize", "options": {"excludeByName": dict.fromkeys(names, True)}}


def unit_override(pattern: str, unit: str) -> Json:
    return {"matcher": {"id": "byRegexp", "options": pattern}, "properties": [{"id": "unit", "value": unit}]}


def row(title: str) -> Panel:
    return Panel({"type": "row", "title": title, "collapsed": False, "panels": []}, GRID_WIDTH, 1)


def layout(panels: list[Panel]) -> list[Json]:
    """Place panels left to right in a 24-column grid, rows on a line of their own; number them."""
    placed: list[Json] = []
    x = y = line_height = 0
    for panel_id, panel in enumerate(panels, start=1):
        if x + panel.width > GRID_WIDTH or (panel.body["type"] == "row" and x):
            x, y, line_height = 0, y + line_height, 0
        placed.append(
            {"id": panel_id, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y}, **panel.body}
        )
        x += panel.width
        line_height = max(line_height, panel.height)
    return placed
