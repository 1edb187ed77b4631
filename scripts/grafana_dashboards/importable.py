"""The hand-import variant of a dashboard: ${DS_*} inputs in place of the provisioned datasources."""

from typing import Any

from grafana_dashboards.dashboard import GRAFANA_VERSION
from grafana_dashboards.queries import DATASOURCES, Datasource, Json


def importable(provisioned: Json) -> Json:
    """The dashboard with ${DS_*} inputs in place of the provisioned datasource uids.

    Grafana's Import page asks for one datasource per input and substitutes its uid.
    """
    used: dict[str, Datasource] = {}
    body = _swap(provisioned, {ds.uid: ds for ds in DATASOURCES}, used)
    sources = sorted(used.values(), key=lambda s: s.input)
    panel_types = sorted({p["type"] for p in provisioned["panels"] if p["type"] != "row"})
    inputs = [
        {
            "name": source.input,
            "label": source.name,
            "description": f"The {source.name} datasource holding protolab's data",
            "type": "datasource",
            "pluginId": source.type,
            "pluginName": source.name,
        }
        for source in sources
    ]
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
        *({"type": "datasource", "id": s.type, "name": s.name, "version": "1.0.0"} for s in sources),
        *({"type": "panel", "id": kind, "name": kind, "version": ""} for kind in panel_types),
    ]
    return {"__inputs": inputs, "__requires": requires, **body}


def _swap(node: Any, by_uid: dict[str, Datasource], used: dict[str, Datasource]) -> Any:
    """A copy of a JSON tree with each provisioned datasource reference an input; `used` collects them."""
    if isinstance(node, dict):
        ref = node.get("datasource")
        if isinstance(ref, dict) and ref.get("uid") in by_uid:
            source = by_uid[ref["uid"]]
            used[source.input] = source
            node = {**node, "datasource": {"type": source.type, "uid": f"${{{source.input}}}"}}
        return {key: _swap(value, by_uid, used) for key, value in node.items()}
    if isinstance(node, list):
        return [_swap(item, by_uid, used) for item in node]
    return node
