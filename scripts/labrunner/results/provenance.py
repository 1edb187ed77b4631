"""Where a run came from: git revision, library and tool versions, and the host."""

import os
import platform
import subprocess
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from google.protobuf.internal import api_implementation

from labrunner.observe import fingerprint, steal_clock
from labrunner.paths import release
from labrunner.results import methodology
from labrunner.run.k6.binary import k6_version
from services.common import interpreter
from services.common.stacks import STACKS

# What the services or the runner's clients share besides each stack's own: serialization, the event
# loop, HTTP.
SHARED_LIBRARIES = ("protobuf", "uvloop", "orjson", "httpx")
# Distributions whose versions change what is measured: each stack's (services.common.stacks), the shared.
LIBRARIES = tuple(dict.fromkeys([*(name for s in STACKS for name in s.distributions), *SHARED_LIBRARIES]))


def collect(root: Path, k6_binary: Path) -> dict[str, Any]:
    """The manifest's provenance: the release that wrote it (CHANGELOG.md), the methodology, git,
    versions, host, the host's fingerprint and its steal clock."""
    found = versions(k6_binary)
    return {
        "release": release(),
        "methodology": methodology.VERSION,
        "git": git_info(root),
        "versions": found,
        "host": host_info(),
        "fingerprint": fingerprint.read(interpreter=found["python"]),
        "steal_clock": asdict(steal_clock.this_kernel()),
    }


def git_info(root: Path) -> dict[str, Any]:
    """The commit checked out and whether the tree has uncommitted changes."""
    sha = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def versions(k6_binary: Path) -> dict[str, str | None]:
    """Python and its build, k6, the protobuf backend (upb, cpp or python) and the measured libraries."""
    build = interpreter.describe()
    found: dict[str, str | None] = {
        # The runner's own; each result records the build its service ran (the same venv locally).
        "python": f"{build['implementation']} {build['version']} {build['executable']} "
        f"(optimized: {build['optimized']}, libpython {build['libpython']})",
        "k6": k6_version(k6_binary),
        "protobuf_backend": api_implementation.Type(),
    }
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def host_info() -> dict[str, Any]:
    """CPU model and counts, memory and kernel of the machine running the lab."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)),
        "memory_bytes": _mem_total(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "hostname": platform.node(),
    }


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a checkout, no commit yet, or no git
    return out.stdout.strip()


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
