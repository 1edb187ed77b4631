"""Lint of the Grafana provisioning and dashboards, without a Grafana: ids, datasources, variables, drift."""

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.compose_file import compose
from tests.dashboard_queries import TEMPLATE
from tests.support import ROOT

GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
IMPORTS = sorted((GRAFANA / "import").glob("*.json"))
# Stable: bookmarks, links and imports into other Grafanas rely on them.
EXPECTED_UIDS = {
    "k6-http.json": "protolab-k6-http",
    "k6-grpc.json": "protolab-k6-grpc",
    "service.json": "protolab-service",
    "grpc-server.json": "protolab-grpc-server",
    "matrix.json": "protolab-matrix",
}
GRAFANA_MACROS = {
    "__interval",
    "__interval_ms",
    "__rate_interval",
    "__range",
    "__range_s",
    "__range_ms",
    "__from",
    "__to",
    "__dashboard",
    "__org",
    "__user",
    "timeFilter",
}
IMPORT_INPUT = re.compile(r"^\$\{(DS_[A-Z0-9_]+)\}$")
# The schemaVersion each Grafana writes for classic dashboards (DASHBOARD_SCHEMA_VERSION in grafana/grafana
# public/app/features/dashboard/state/DashboardMigrator.ts). When compose moves to a Grafana not listed
# here, look up what it writes and set SCHEMA_VERSION and GRAFANA_VERSION in
# scripts/grafana_dashboards/dashboard.py.
SCHEMA_VERSION_OF_GRAFANA = {"12.4": 42}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _provisioned_datasources() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "datasources.yml").read_text())
    return {ds["uid"]: ds for ds in config["datasources"]}


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair in a JSON tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _text(query: dict[str, Any]) -> str:
    return query.get("expr") or query.get("query") or ""


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) for every query Grafana sends: panel targets, variables, annotations."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", _text(target)
    for variable in dashboard["templating"]["list"]:
        yield f"variable {variable['name']}", _text(variable)
    for annotation in dashboard["annotations"]["list"]:
        yield f"annotation {annotation['name']!r}", _text(annotation)


def test_generated_dashboards_are_up_to_date():
    command = [sys.executable, "scripts/gen_dashboards.py", "--check"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", sorted(GRAFANA.rglob("*.json")), ids=lambda p: str(p.relative_to(GRAFANA)))
def test_valid_json(path: Path):
    assert isinstance(_load(path), dict)


def _compose_grafana_version() -> str:
    """The tag of compose's default Grafana image (GRAFANA_IMAGE unset)."""
    image, _, tag = compose()["services"]["grafana"]["image"].partition(":")
    assert image == "grafana/grafana"
    return tag


def test_dashboards_are_written_for_the_grafana_compose_runs():
    version = _compose_grafana_version()
    minor = ".".join(version.split(".")[:2])
    assert minor in SCHEMA_VERSION_OF_GRAFANA, f"which schemaVersion does Grafana {version} write?"
    for path in DASHBOARDS + IMPORTS:
        assert _load(path)["schemaVersion"] == SCHEMA_VERSION_OF_GRAFANA[minor], path
    for path in IMPORTS:
        requires = {r["id"]: r for r in _load(path)["__requires"]}
        assert requires["grafana"]["version"] == version, path


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_no_panel_is_shown_twice(path: Path):
    titles = [panel["title"] for panel in _panels(_load(path)) if panel["type"] != "row"]
    assert len(titles) == len(set(titles))


def test_uids_are_stable_and_unique():
    assert {p.name: _load(p)["uid"] for p in DASHBOARDS} == EXPECTED_UIDS
    assert {p.name: _load(p)["uid"] for p in IMPORTS} == EXPECTED_UIDS


@pytest.mark.parametrize("path", DASHBOARDS + IMPORTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_numeric_ids(path: Path):
    dashboard = _load(path)
    assert dashboard["id"] is None
    assert not [key for key, _ in _walk(dashboard) if key in ("datasourceId", "gnetId")]


def test_datasources_have_the_contract_uids():
    datasources = _provisioned_datasources()
    assert datasources["protolab-prometheus"]["type"] == "prometheus"
    assert datasources["protolab-prometheus"]["url"] == "http://prometheus:9090"
    assert datasources["protolab-influxdb"]["type"] == "influxdb"
    assert datasources["protolab-influxdb"]["url"] == "http://influxdb:8086"
    assert datasources["protolab-influxdb"]["jsonData"]["dbName"] == "myk6db"


def test_prometheus_datasource_interval_is_the_scrape_interval():
    # $__rate_interval is derived from it: too small and rate() gets fewer than two samples.
    scrape = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())["global"]["scrape_interval"]
    assert _provisioned_datasources()["protolab-prometheus"]["jsonData"]["timeInterval"] == scrape


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_datasource_is_provisioned_and_referenced_by_uid(path: Path):
    datasources = _provisioned_datasources()
    refs = [value for key, value in _walk(_load(path)) if key == "datasource"]
    assert refs
    for ref in refs:
        # A name string or a numeric id breaks as soon as the Grafana is not this one.
        assert isinstance(ref, dict), ref
        assert ref["uid"] in datasources, ref
        assert ref["type"] == datasources[ref["uid"]]["type"], ref


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_has_a_query(path: Path):
    panels = [panel for panel in _panels(_load(path)) if panel["type"] != "row"]
    assert panels, path.name
    for panel in panels:
        targets = panel.get("targets", [])
        assert targets, panel["title"]
        for target in targets:
            assert _text(target).strip(), (panel["title"], target["refId"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_variable_used_is_defined(path: Path):
    dashboard = _load(path)
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    undefined = [
        (where, name)
        for where, text in _queries(dashboard)
        for match in TEMPLATE.finditer(text)
        if (name := match[1] or match[2] or match[4]) not in defined | GRAFANA_MACROS
    ]
    assert not undefined


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_run_specific_things_are_variables(path: Path):
    dashboard = _load(path)
    assert [v["name"] for v in dashboard["templating"]["list"]] == [
        "run",
        "target",
        "profile",
        "connections",
        "churn",
        "compression",
        "scenario",
    ]
    for where, text in _queries(dashboard):
        if where.startswith("panel") or where.startswith("annotation"):
            assert "$run" in text, where


def test_provisioned_tree_holds_no_import_variants():
    # Grafana's file provider reads its folder recursively; a ${DS_*} file there would load broken.
    assert not [p for p in (GRAFANA / "dashboards").rglob("*.json") if "__inputs" in _load(p)]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_import_variant_declares_exactly_the_inputs_it_uses(path: Path):
    provisioned = _load(path)
    imported = _load(GRAFANA / "import" / path.name)
    inputs = {i["name"]: i for i in imported.pop("__inputs")}
    requires = {(r["type"], r["id"]) for r in imported.pop("__requires")}
    datasources = _provisioned_datasources()
    uid_of_input = {}
    for key, ref in _walk(imported):
        if key != "datasource":
            continue
        match = IMPORT_INPUT.match(ref["uid"])
        assert match, f"import variant references {ref} instead of a ${{DS_*}} input"
        declared = inputs[match[1]]
        assert declared["type"] == "datasource"
        assert declared["pluginId"] == ref["type"]
        assert ("datasource", ref["type"]) in requires
        uid_of_input[ref["uid"]] = next(uid for uid, ds in datasources.items() if ds["type"] == ref["type"])
    assert {IMPORT_INPUT.match(u)[1] for u in uid_of_input} == set(inputs)
    # Apart from the inputs, the import variant is the provisioned dashboard.
    text = json.dumps(imported)
    for placeholder, uid in uid_of_input.items():
        text = text.replace(json.dumps(placeholder), json.dumps(uid))
    assert json.loads(text) == provisioned
