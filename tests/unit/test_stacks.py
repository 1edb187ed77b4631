"""Every server stack services/common/stacks.py declares has each place a stack needs, and every
server in services/ is declared: a new stack that misses one fails here, naming what it lacks.

The places that cannot read the declaration are checked against it: its folder and floor server,
its targets in matrix.toml, its compose service, the import-linter contracts, its libraries
installed, and its name in the certificate the lab generates."""

import tomllib
from pathlib import Path
from typing import Any

import pytest
from labrunner import certs
from labrunner.model.matrix import MatrixError, expand, load_matrix, parse_matrix
from labrunner.model.questions import FLOOR_PREFIX
from labrunner.model.scenario import Target
from labrunner.results import provenance
from matplotlib.markers import MarkerStyle

from services.common.stacks import BY_PACKAGE, STACKS, Stack
from tests.compose_file import compose
from tests.support import ROOT

# The packages that must import no server's own modules: an import-linter contract per package.
SERVER_FREE = ("labrunner", "benchmarks.floor")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the checks read once: the matrix, compose's services, the contracts and the certificate."""
    matrix = load_matrix(ROOT / "matrix.toml")
    directory = tmp_path_factory.mktemp("certs")
    certs.generate(directory)
    return {
        "targets": matrix.targets,
        "floor_preset": {s.target.name for s in expand(matrix, "local", "floor").scenarios},
        "compose": compose()["services"],
        "contracts": tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
            "contracts"
        ],
        "sans": certs.server_names(directory),
        "versions": provenance.versions(Path("/bin/true")),  # a manifest's (k6's own is not asked here)
    }


def _files(stack: Stack) -> list[str]:
    wanted = (f"services/{stack.package}/__main__.py", f"benchmarks/floor/{stack.package}.py")
    return [path for path in wanted if not (ROOT / path).is_file()]


def _targets(stack: Stack, targets: dict[str, Target], floor_preset: set[str]) -> list[str]:
    lab = {name for name, t in targets.items() if t.service == stack.package and t.module is None}
    if not lab:
        return [f'a target in matrix.toml with service = "{stack.package}"']
    lacks = [
        f"a target in matrix.toml speaking {protocol}, which it declares"
        for protocol in stack.protocols
        if all(targets[name].protocol != protocol for name in lab)
    ]
    floors = [
        name
        for name, t in targets.items()
        if t.module == stack.floor_module and name.removeprefix(FLOOR_PREFIX) in lab
    ]
    if not floors:
        lacks.append(f'a target {FLOOR_PREFIX}<one of {sorted(lab)}> with module = "{stack.floor_module}"')
    elif not any({name, name.removeprefix(FLOOR_PREFIX)} <= floor_preset for name in floors):
        lacks.append(f"{floors[0]} and {floors[0].removeprefix(FLOOR_PREFIX)} in matrix.toml's preset floor")
    return lacks


def _compose(stack: Stack, services: dict[str, Any]) -> list[str]:
    service = services.get(stack.compose_name)
    if service is None:
        return [f"a docker-compose.yml service {stack.compose_name}"]
    args = service.get("build", {}).get("args", {})
    built = (args.get("SERVICE"), args.get("PORT"), args.get("METRICS_PORT"), service.get("command"))
    declared = (
        stack.package,
        str(stack.port),
        str(stack.metrics_port),
        ["python", "-m", f"services.{stack.package}"],
    )
    if built != declared:
        return [
            f"docker-compose.yml's {stack.compose_name} built and run as declared: {built} is not {declared}"
        ]
    return []


def _contracts(stack: Stack, contracts: list[dict[str, Any]]) -> list[str]:
    module = f"services.{stack.package}"
    return [
        f"{module} in pyproject.toml's import-linter contract keeping {source} off the servers' modules"
        for source in SERVER_FREE
        if not any(
            source in c.get("source_modules", []) and module in c.get("forbidden_modules", [])
            for c in contracts
        )
    ]


def _recorded(stack: Stack, versions: dict[str, str | None]) -> list[str]:
    return [
        f"its distribution {name} in every manifest's versions (results/provenance.py)"
        if name not in versions
        else f"its distribution {name} installed (pyproject.toml, requirements*.txt)"
        for name in stack.distributions
        if versions.get(name) is None
    ]


def _marker(stack: Stack) -> list[str]:
    try:
        MarkerStyle(stack.marker)
    except ValueError:
        return [f"a matplotlib marker for the payload charts ({stack.marker!r} is none)"]
    return []


def _certificate(stack: Stack, sans: set[str]) -> list[str]:
    return [] if stack.compose_name in sans else [f"{stack.compose_name} in the certificate's SANs"]


def lacks(stack: Stack, places: dict[str, Any]) -> list[str]:
    """Every place this stack misses (docs/architecture.md, "Adding a server stack")."""
    return [
        *_marker(stack),
        *_files(stack),
        *_targets(stack, places["targets"], places["floor_preset"]),
        *_compose(stack, places["compose"]),
        *_contracts(stack, places["contracts"]),
        *_recorded(stack, places["versions"]),
        *_certificate(stack, places["sans"]),
    ]


@pytest.mark.parametrize("stack", STACKS, ids=[s.package for s in STACKS])
def test_a_declared_stack_has_every_place_it_needs(stack: Stack, places: dict[str, Any]) -> None:
    missing = lacks(stack, places)
    assert not missing, f"stack {stack.package} lacks: " + "; ".join(missing)


def test_every_server_in_services_and_in_compose_is_declared(places: dict[str, Any]) -> None:
    servers = {path.parent.name for path in (ROOT / "services").glob("*/__main__.py")}
    built = {
        s["build"]["args"]["SERVICE"]
        for s in places["compose"].values()
        if "SERVICE" in s.get("build", {}).get("args", {})
    }
    assert servers and built, "the test must see the servers"
    undeclared = sorted((servers | built) - set(BY_PACKAGE))
    assert not undeclared, f"services/common/stacks.py declares no stack for {undeclared}"


def test_no_two_stacks_share_a_port_or_a_marker() -> None:
    ports = [port for s in STACKS for port in (s.port, s.metrics_port)]
    markers = [s.marker for s in STACKS]
    assert len(set(ports)) == len(ports), ports
    assert len(set(markers)) == len(markers), markers


def _load_with(target: dict[str, Any]) -> None:
    """matrix.toml with one more target, [targets.probe]."""
    data = tomllib.loads((ROOT / "matrix.toml").read_text())
    parse_matrix({**data, "targets": {**data["targets"], "probe": target}}, ROOT / "matrix.toml")


def test_a_target_speaks_only_a_protocol_its_stack_serves() -> None:
    http2 = {"script": "k6/rest.js", "protocol": "http2", "tls": True, "expect_proto": "HTTP/2.0"}
    _load_with({"service": "rest_quart", **http2})
    message = r"^\[targets.probe\] protocol: 'http2' is not one rest_aiohttp serves \(http1.1\)$"
    with pytest.raises(MatrixError, match=message):
        _load_with({"service": "rest_aiohttp", **http2})


def test_a_target_names_a_declared_stack() -> None:
    grpc = {"script": "k6/grpc_unary.js", "protocol": "grpc", "tls": False}
    _load_with({"service": "grpc_aio", **grpc})
    with pytest.raises(
        MatrixError, match=r"^\[targets.probe\] service: 'grpc_nowhere' must be .* declared stack$"
    ):
        _load_with({"service": "grpc_nowhere", **grpc})
