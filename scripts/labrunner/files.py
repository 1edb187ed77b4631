"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON so readers see the old file or the new one, never a partial one."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a crash after replace must not leave an empty file
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are read by other tools
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
