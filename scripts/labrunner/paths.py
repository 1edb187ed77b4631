"""Where the lab's files are (the checkout `protolab` runs: its matrix.toml, k6/, services/ and
configs, and its results/), and which release this package is.

The checkout is, in order: the directory `PROTOLAB_HOME` names; the source tree this package runs
from (the clone, as scripts/setup.sh installs it editable); the current directory or its nearest
parent that is a checkout (a package installed with `pip install <clone>` runs from site-packages).
"""

import os
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

HOME_VARIABLE = "PROTOLAB_HOME"
DISTRIBUTION = "protolab"  # pyproject.toml's [project] name
# What a directory must hold to be a checkout the runner can use.
MARKERS = ("matrix.toml", "docker-compose.yml", "k6", "services")

SOURCE_TREE = Path(__file__).resolve().parents[2]


def is_checkout(path: Path) -> bool:
    return all((path / name).exists() for name in MARKERS)


def find_checkout(environ: Mapping[str, str] = os.environ, cwd: Path | None = None) -> Path | None:
    """The checkout, or None: then only `protolab --version` answers (see no_checkout)."""
    if home := environ.get(HOME_VARIABLE):
        path = Path(home).expanduser().resolve()
        return path if is_checkout(path) else None
    if is_checkout(SOURCE_TREE):
        return SOURCE_TREE
    try:
        here = (cwd or Path.cwd()).resolve()
    except OSError:  # the current directory was removed
        return None
    return next((d for d in (here, *here.parents) if is_checkout(d)), None)


def no_checkout(environ: Mapping[str, str] = os.environ) -> str:
    """What `protolab` says when find_checkout found none."""
    if home := environ.get(HOME_VARIABLE):
        where = f"{HOME_VARIABLE}={home} is not a protolab checkout (it lacks one of {', '.join(MARKERS)})"
    else:
        where = "no protolab checkout in the current directory or its parents"
    return (
        f"protolab: {where}. The command runs the lab of a checkout (its matrix.toml, k6 scripts, "
        f"services and configs; results go to its results/): run it inside a clone set up by "
        f"scripts/setup.sh, or set {HOME_VARIABLE} to one."
    )


def release() -> str:
    """This package's release: the source tree's pyproject.toml version when it runs from one (a
    clone, even if its editable install is older), else the installed distribution's."""
    pyproject = SOURCE_TREE / "pyproject.toml"
    if is_checkout(SOURCE_TREE) and pyproject.is_file():
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


CHECKOUT = find_checkout()
# Without a checkout the package's own parent, so that importing a module never fails; `protolab`
# says what is missing before it imports the runner (labrunner/__main__.py).
REPO = CHECKOUT or SOURCE_TREE
