"""Prepare prometheus_client multiprocess mode; must run before prometheus_client is imported.

prometheus_client picks its value storage when it is first imported, from
PROMETHEUS_MULTIPROC_DIR. Files left by an earlier run would add their counts to
this one, so the directory is wiped at every start.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def prepare_multiprocess_dir() -> Path:
    """Point PROMETHEUS_MULTIPROC_DIR at an empty directory (a fresh temp dir if unset)."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if configured:
        directory = Path(configured)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="protolab-metrics-"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        # Ours alone: remove it when this (supervising) process exits. Forked workers leave
        # through os._exit, which skips atexit, so they cannot remove it under the others.
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory
