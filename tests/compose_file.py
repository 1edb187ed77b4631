"""docker-compose.yml as Compose reads it: variables resolved by the Compose Specification's rules."""

import re
from collections.abc import Mapping
from typing import Any

import yaml

from tests.support import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
# The variables a user must provide; everything else has a default.
REQUIRED_ENV = {
    "GRAFANA_ADMIN_PASSWORD": "test-only-password",
    # InfluxDB's users' passwords: scripts/setup.sh generates them into .env.
    "INFLUXDB_ADMIN_PASSWORD": "test-only-admin",
    "INFLUXDB_WRITE_PASSWORD": "test-only-writer",
    "INFLUXDB_READ_PASSWORD": "test-only-reader",
}

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_]\w*))"
)


class InterpolationError(ValueError):
    """A ${VAR:?message} whose variable is missing."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Resolve $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, ${VAR:+alt}, $$."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"], interpolate(match["arg"] or "", env)
        value = env.get(name)
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in {":-", "-"}:
            return arg if missing else str(value)
        if op in {":+", "+"}:
            return "" if missing else arg
        if op in {":?", "?"} and missing:
            raise InterpolationError(f"{name}: {arg}")
        return value or ""

    return _VARIABLE.sub(replace, text)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    return node


def raw_compose() -> dict[str, Any]:
    """The compose file as written (YAML anchors and merge keys resolved, variables not)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file with every variable resolved against env (only REQUIRED_ENV by default)."""
    return resolve(raw_compose(), {**REQUIRED_ENV, **(env or {})})


def compose_variables() -> set[str]:
    """Every variable the compose file reads."""
    return {m["name"] or m["bare"] for m in _VARIABLE.finditer(COMPOSE_FILE.read_text()) if not m["escaped"]}
