"""Which Python build runs a process, and the choice of the fastest one for the lab's venv.

The interpreter's build moves every CPU-bound number (measured: docs/local-backend.md), so every
service says which build it runs (in its listening line), and setup prefers an optimized one.

Standard library only: scripts/setup.sh runs this file (`python3 services/common/interpreter.py
pick`) before any package is installed.
"""

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# The Python version the pinned requirements are resolved for.
LAB_PYTHON = (3, 11)
_DPKG_TIMEOUT_S = 5


def describe() -> dict[str, object]:
    """This process's interpreter: version, executable and how it was built.

    `optimized` is "pgo+lto", "pgo", "lto" (from the configure arguments), "distribution" (a
    Debian/Ubuntu package: those build the executable with PGO and LTO, though sysconfig describes
    their separate shared-library build) or "no" (none of these).
    """
    config_args = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    pgo = "--enable-optimizations" in config_args
    lto = "--with-lto" in config_args
    if pgo or lto:
        optimized = "+".join(name for name, on in (("pgo", pgo), ("lto", lto)) if on)
    else:
        optimized = "distribution" if _packaged(sys.executable) else "no"
    return {
        "implementation": platform.python_implementation(),
        "version": platform.python_version(),
        "executable": os.path.realpath(sys.executable),
        "optimized": optimized,
        "libpython": "shared" if _libpython_mapped() else "static",
    }


def _libpython_mapped() -> bool:
    """Whether this process runs on a shared libpython (an --enable-shared executable)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
    return "/libpython" in maps


def _packaged(executable: str) -> bool:
    """Whether a dpkg package installed this executable (a distribution build)."""
    if not shutil.which("dpkg-query"):
        return False
    try:
        found = subprocess.run(
            ["dpkg-query", "-S", os.path.realpath(executable)],
            capture_output=True,
            timeout=_DPKG_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return found.returncode == 0


def pick(candidates: list[str]) -> str:
    """The first optimized candidate of the lab's Python version that can make a venv, else the
    first of that version; the first candidate when none qualifies (venv creation then says why)."""
    described = []
    for candidate in dict.fromkeys(filter(None, (shutil.which(c) for c in candidates))):
        try:
            out = subprocess.run(
                [candidate, __file__, "describe"], capture_output=True, text=True, timeout=30, check=True
            )
            facts = json.loads(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if tuple(facts["version_info"]) == LAB_PYTHON and facts["can_make_venv"]:
            described.append((candidate, facts))
    for candidate, facts in described:
        if facts["optimized"] != "no":
            return candidate
    return described[0][0] if described else candidates[0]


def _describe_for_pick() -> dict[str, object]:
    # Debian ships ensurepip apart, in python3.X-venv.
    can_make_venv = all(importlib.util.find_spec(name) for name in ("ensurepip", "venv"))
    return {**describe(), "version_info": list(sys.version_info[:2]), "can_make_venv": can_make_venv}


if __name__ == "__main__":
    if sys.argv[1:2] == ["describe"]:
        print(json.dumps(_describe_for_pick()))
    elif sys.argv[1:2] == ["pick"]:
        # PROTOLAB_PYTHON wins; otherwise what is on PATH, then the distribution's interpreter.
        forced = os.environ.get("PROTOLAB_PYTHON")
        print(forced or pick(["python3.11", "/usr/bin/python3.11", "python3"]))
    else:
        sys.exit(f"usage: {sys.argv[0]} describe|pick")
