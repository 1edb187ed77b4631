"""The release: CHANGELOG.md's newest entry is pyproject.toml's version, and --version and the manifest
name it; the declared dependencies cover every import and agree with the pinned requirements files;
the checkout the command runs is found, or its absence said."""

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from labrunner import paths
from labrunner.cli import version
from labrunner.results import methodology, provenance

from tests.support import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# "## 0.2.0 (2026-12-02)": a release's heading.
ENTRY = re.compile(r"^## (?P<version>\d+\.\d+\.\d+) \((?P<date>\d{4}-\d{2}-\d{2})\)$", re.MULTILINE)
FIRST_PARTY = {"labrunner", "services", "benchmarks", "tests"}
IMPORTING = ("scripts/labrunner", "services", "benchmarks")  # what the package installs
# "httpx[http2]==0.28.1": every pin here is exact (pyproject.toml and the requirements files alike).
PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(\[[^\]]*\])?==(?P<version>\S+)$")


def changelog_entries() -> list[tuple[str, str, str]]:
    """(version, date, text) of each release in CHANGELOG.md, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    heads = list(ENTRY.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [(h["version"], h["date"], text[h.end() : end]) for h, end in zip(heads, ends, strict=True)]


def test_the_newest_changelog_entry_is_the_pyproject_version() -> None:
    entries = changelog_entries()
    assert entries, "CHANGELOG.md has no '## X.Y.Z (YYYY-MM-DD)' entry"
    newest, _, _ = entries[0]
    assert newest == PROJECT["version"], (
        f"pyproject.toml says {PROJECT['version']}, CHANGELOG.md's newest entry {newest}: "
        "a release needs both"
    )


def test_changelog_entries_run_newest_first_and_each_says_whether_results_compare() -> None:
    entries = changelog_entries()
    assert len(entries) >= 2, "CHANGELOG.md's entries were not found: nothing would be checked"
    versions = [tuple(int(part) for part in v.split(".")) for v, _, _ in entries]
    assert versions == sorted(versions, reverse=True), versions
    assert len(set(versions)) == len(versions), versions
    dates = [date for _, date, _ in entries]
    assert dates == sorted(dates, reverse=True), dates
    for release, _, text in entries:
        assert "**Comparable with results before it**" in text, f"{release} does not say"


def test_the_newest_entry_names_the_current_methodology() -> None:
    _, _, text = changelog_entries()[0]
    named = {int(v) for v in re.findall(r"\*\*Methodology v(\d+)\*\*", text)}
    assert named == {methodology.VERSION}, (named, methodology.VERSION)


def test_version_and_manifest_name_the_release() -> None:
    assert paths.release() == PROJECT["version"]
    assert version.describe("protolab").startswith(f"protolab {PROJECT['version']} ")
    manifest = provenance.collect(ROOT, Path(sys.executable).with_name("k6"))
    assert manifest["release"] == PROJECT["version"]
    assert manifest["methodology"] == methodology.VERSION


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules imported under what the package installs, each with a file importing it."""
    found: dict[str, set[str]] = {}
    for folder in IMPORTING:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines: list[str], where: str) -> dict[str, str]:
    """{distribution: version} of `name==version` lines; an unpinned one fails naming it."""
    pins: dict[str, str] = {}
    for line in lines:
        if not (pin := line.split("#")[0].strip()) or pin.startswith("-"):
            continue
        match = PIN.match(pin)
        assert match, f"{where}: {pin!r} is not pinned exactly"
        pins[canonical(match["name"])] = match["version"]
    return pins


def _declared(requirements: list[str]) -> dict[str, str]:
    return _pins(requirements, "pyproject.toml")


def _pinned(*files: str) -> dict[str, str]:
    return {k: v for name in files for k, v in _pins((ROOT / name).read_text().splitlines(), name).items()}


def test_every_import_is_a_declared_dependency() -> None:
    imports = _third_party_imports()
    assert {"grpc", "aiohttp", "rich", "docker"} <= imports.keys(), sorted(imports)
    declared = _declared(PROJECT["dependencies"])
    providers = metadata.packages_distributions()
    undeclared = {
        module: sorted(where)[0]
        for module, where in imports.items()
        if not {canonical(d) for d in providers.get(module, [])} & declared.keys()
    }
    assert not undeclared, f"imported but not in [project] dependencies (module: a file): {undeclared}"


def test_declared_pins_agree_with_the_requirements_files() -> None:
    pins = _pinned("requirements.txt", "requirements-lab.txt")
    declared = _declared(PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"])
    assert declared
    differ = {name: (pin, pins.get(name)) for name, pin in declared.items() if pins.get(name) != pin}
    assert not differ, f"pyproject.toml against requirements*.txt: {differ}"


def _checkout(where: Path) -> Path:
    for name in paths.MARKERS:
        (where / name).mkdir(parents=True)
    return where


def test_the_checkout_is_the_home_variable_then_the_source_tree(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "clone")
    assert paths.find_checkout({paths.HOME_VARIABLE: str(checkout)}, cwd=ROOT) == checkout
    # The tests run from the clone, as an editable install does: its source tree comes before the
    # working directory.
    assert paths.is_checkout(ROOT)
    assert paths.find_checkout({}, cwd=checkout) == paths.SOURCE_TREE == ROOT


def test_installed_the_checkout_is_the_working_directory_or_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As from site-packages: the package's own parent is no checkout.
    monkeypatch.setattr(paths, "SOURCE_TREE", tmp_path / "venv" / "lib" / "python3.11")
    checkout = _checkout(tmp_path / "clone")
    inside = checkout / "results" / "some-run"
    inside.mkdir(parents=True)
    assert paths.find_checkout({}, cwd=inside) == checkout
    assert paths.find_checkout({}, cwd=checkout) == checkout
    assert paths.find_checkout({}, cwd=tmp_path) is None
    # Installed, the release is the distribution's (the editable one here), not a pyproject's.
    assert paths.release() == metadata.version(paths.DISTRIBUTION)


def test_a_missing_checkout_is_said_with_where_to_find_one(tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    (partial / "matrix.toml").parent.mkdir()
    (partial / "matrix.toml").write_text("")
    environ = {paths.HOME_VARIABLE: str(partial)}
    assert paths.find_checkout(environ, cwd=ROOT) is None
    said = paths.no_checkout(environ)
    assert f"{paths.HOME_VARIABLE}={partial} is not a protolab checkout" in said
    assert "docker-compose.yml" in said
    assert "no protolab checkout in the current directory" in paths.no_checkout({})
