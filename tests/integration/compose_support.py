"""What the docker-compose.yml tests (tests/integration/test_compose_*.py) share: services/Dockerfile's
stages and what an image gets from them, .dockerignore, and facts of the compose file (the systems
under test, published ports, the contract table's services).
"""

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tests.support import ROOT

ENV_EXAMPLE = ROOT / ".env.example"
CONTRACTS = ROOT / "docs" / "CONTRACTS.md"
LOOPBACK = "127.0.0.1"


# --- Dockerfiles, .dockerignore ------------------------------------------------------------


@dataclass
class Stage:
    """One FROM section of a Dockerfile and its instructions, continuation lines joined."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(path: Path) -> list[Stage]:
    """Parse FROM ... [AS name] sections; comments dropped, backslash continuations joined."""
    logical = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: FROM may use their defaults
    for line in logical.splitlines():
        if not line.strip():
            continue
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            parts = _substitute(rest, global_args).split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return stages


def stage_chain(stages: list[Stage], target: str | None) -> list[Stage]:
    """The target stage (default: the last) and the stages it builds FROM, outermost first."""
    by_name = {stage.name: stage for stage in stages if stage.name}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        chain.insert(0, stage)
    return chain


def _substitute(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], ""), text)


def image_environment(build: Mapping[str, Any]) -> dict[str, str]:
    """ENV a container of this build gets from its image, with the compose build args applied."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    args = {key: str(value) for key, value in (build.get("args") or {}).items()}
    env: dict[str, str] = {}
    for stage in stage_chain(stages, build.get("target")):
        for keyword, rest in stage.instructions:
            if keyword == "ENV":
                for token in shlex.split(rest):
                    key, _, value = token.partition("=")
                    env[key] = _substitute(value, {**args, **env})
    return env


def image_user(build: Mapping[str, Any]) -> str:
    """The USER a container of this build runs as ("root" when the Dockerfile never sets one)."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    users = [
        rest
        for stage in stage_chain(stages, build.get("target"))
        for kw, rest in stage.instructions
        if kw == "USER"
    ]
    return users[-1] if users else "root"


def image_healthcheck(build: Mapping[str, Any]) -> list[str]:
    """The exec-form HEALTHCHECK CMD of this build's image."""
    stages = dockerfile_stages(ROOT / build.get("context", ".") / build["dockerfile"])
    checks = [
        rest
        for stage in stage_chain(stages, build.get("target"))
        for kw, rest in stage.instructions
        if kw == "HEALTHCHECK"
    ]
    assert checks, "the image has no HEALTHCHECK"
    return json.loads(checks[-1].split(" CMD ", 1)[1])


def dockerignore_includes(context: Path, relative: str) -> bool:
    """Whether .dockerignore sends this path (or any file under this folder) to the builder."""
    ignore = context / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines()] if ignore.exists() else []
    included = True
    path = relative.strip("/")
    prefixes = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
    for line in (p for p in patterns if p and not p.startswith("#")):
        pattern = line.lstrip("!").strip("/")
        if any(fnmatch(prefix, pattern) for prefix in prefixes):
            included = line.startswith("!")
    return included


# --- Shared facts ---------------------------------------------------------------------------


def contract_services() -> list[tuple[str, int, int, str]]:
    """(module, port, metrics port, compose name) rows of the services table in docs/CONTRACTS.md."""
    row = r"^\|[^|]*\|\s*services\.(\w+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\w-]+)\s*\|"
    rows = re.findall(row, CONTRACTS.read_text(), re.M)
    assert rows, "no services table in docs/CONTRACTS.md"
    return [(module, int(port), int(metrics), name) for module, port, metrics, name in rows]


def systems_under_test(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services built from the service stage of services/Dockerfile."""
    return {
        name: service
        for name, service in config["services"].items()
        if isinstance(service.get("build"), dict) and service["build"].get("target") == "service"
    }


def published(service: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of every published port, short or long syntax."""
    result = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result.append((port.get("host_ip", ""), str(port.get("published", "")), str(port["target"])))
        else:
            parts = str(port).rsplit("/", 1)[0].split(":")
            host_ip = parts[0] if len(parts) == 3 else ""
            result.append((host_ip, parts[-2] if len(parts) > 1 else "", parts[-1]))
    return result


def container_port(config: Mapping[str, Any], host: str, port: int) -> bool:
    """Whether compose service `host` listens on `port` inside the network (published or built in)."""
    service = config["services"].get(host)
    if service is None:
        return False
    ports = {int(target) for _, _, target in published(service)}
    if isinstance(service.get("build"), dict):
        env = image_environment(service["build"])
        ports |= {int(env[key]) for key in ("PORT", "METRICS_PORT") if env.get(key)}
    return port in ports


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|s|m|h)", duration))
