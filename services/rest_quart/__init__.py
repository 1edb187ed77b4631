"""Quart on Hypercorn with Hypercorn's own worker processes: HTTP/1.1, and HTTP/2 over TLS via ALPN.

The supervising process and the workers Hypercorn spawns share one directory, the
metrics multiprocess directory (wiped at every start): each worker creates a ready
file there once started, and the supervisor creates the drain flag there on shutdown.
"""

import os
from pathlib import Path

DRAIN_FLAG = "draining"
READY_PREFIX = "ready-"


def runtime_dir() -> Path:
    """The directory the supervising process and the workers share."""
    return Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
