"""The package's seams: what each room may import, and no side effects on import."""

import ast
import subprocess
import sys

import pytest
from labrunner.model.scenario import BACKENDS
from labrunner.model.schema import _Preset, _Selection

from tests.support import ROOT

PACKAGE = ROOT / "scripts" / "labrunner"
# A backend starts, stops and observes; the runner's modules and the other backend are off limits.
BACKEND_MAY_IMPORT = (
    "labrunner.backends.base",
    "labrunner.backends.cgroups",
    "labrunner.backends.engines",  # the docker backend's: connecting to the engine a role names
    "labrunner.backends.connections",  # counting a service's connections in its namespace's tables
    "labrunner.model",
    "labrunner.network",  # namespaces, link emulators and their verification, as cgroups are limits
    "labrunner.say",
    "labrunner.interrupts",  # holding a Ctrl-C while a process starts and is recorded
    "labrunner.certs",
    "services.common",
)


def _labrunner_imports(path: str) -> set[str]:
    tree = ast.parse((PACKAGE / path).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            # `from labrunner import certs` imports the module labrunner.certs.
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {name for name in names if name.startswith(("labrunner", "services"))}


# Each concrete backend is a package: backends/local/, backends/docker/.
BACKEND_MODULES = sorted(
    str(p.relative_to(PACKAGE))
    for name in ("local", "docker")
    for p in (PACKAGE / "backends" / name).glob("*.py")
)


@pytest.mark.parametrize("backend", BACKEND_MODULES)
def test_a_backend_imports_neither_the_other_nor_the_runner(backend: str) -> None:
    imports = _labrunner_imports(backend)
    assert imports, "the test must see the backend's imports"
    # A backend's modules (backends/<name>/*.py) may import each other.
    own = ("labrunner.backends." + backend.split("/")[1] + ".",)
    assert {name for name in imports if not name.startswith(BACKEND_MAY_IMPORT + own)} == set()


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "run").rglob("*.py"))
)
def test_the_runner_imports_no_concrete_backend(module: str) -> None:
    concrete = ("labrunner.backends.local", "labrunner.backends.docker")
    assert {name for name in _labrunner_imports(module) if name.startswith(concrete)} == set()


def test_a_backend_is_its_package_and_its_name_in_the_registry() -> None:
    """The places a new backend takes: its package (backends/<name>/), its name in BACKENDS and its
    per-backend table of a preset in the schema; a missing one fails here."""
    packages = {p.parent.name for p in (PACKAGE / "backends").glob("*/__init__.py")}
    assert packages == set(BACKENDS)
    assert set(_Preset.model_fields) - set(_Selection.model_fields) == set(BACKENDS)
    for module in (f"labrunner.backends.{name}" for name in BACKENDS):
        # A package: its face (__init__.py) hands on probe and create from the module defining them.
        face = ast.parse((PACKAGE / "backends" / module.rsplit(".", 1)[1] / "__init__.py").read_text())
        handed_on = {
            alias.name: node.module
            for node in face.body
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        assert {"probe", "create"} <= set(handed_on), module
        for name in ("probe", "create"):
            source = ast.parse(
                (PACKAGE / f"{handed_on[name].removeprefix('labrunner.').replace('.', '/')}.py").read_text()
            )
            assert name in {node.name for node in source.body if isinstance(node, ast.FunctionDef)}, module


def test_a_local_run_never_loads_the_docker_sdk_and_importing_sets_nothing() -> None:
    probe = (
        "import os, sys; before = dict(os.environ)\n"
        "from labrunner import backends\nfrom labrunner.cli import run_matrix\n"
        "from labrunner.backends import local\n"
        "assert backends.choose('local') == ('local', 'requested')\n"
        "assert 'docker' not in sys.modules, 'docker SDK imported'\n"
        "assert dict(os.environ) == before, 'importing changed the environment'\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    completed = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr


def test_no_module_manipulates_sys_path() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("scripts", "services", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if "sys.path" in path.read_text() and path.name != "test_layout.py" and "/pb/" not in str(path)
    ]
    assert offenders == []


@pytest.mark.parametrize("options", [["--dry-run", "--backend", "local"], ["--list"]])
def test_listing_and_planning_load_neither_scipy_matplotlib_nor_the_docker_sdk(options: list[str]) -> None:
    """Only a run's summaries and report need scipy and matplotlib, only the docker backend (or
    --backend auto's probe of an engine) the docker SDK."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "scripts" / "run_matrix.py"), *options],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    # stderr: "import time: self [us] | cumulative | imported package", one line per module.
    imported = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in completed.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert {"labrunner", "pydantic"} <= imported, "the test must see the run's imports"
    assert imported & {"scipy", "matplotlib", "docker"} == set()
