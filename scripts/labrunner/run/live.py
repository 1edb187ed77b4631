"""A measured window as it runs: how long it lasts, and k6's counts so far from its REST API.

k6 serves its metrics' current values at GET /v1/metrics/<name> when started with --address;
the runner turns that on only when something shows the window (a terminal), and only where k6
runs on this host (the local backend: k6 in a container is not reachable from here).
"""

import json
import socket
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from labrunner.backends.base import K6Invocation

API_HOST = "127.0.0.1"
REQUESTS_METRIC = "protolab_reqs"  # k6/lib/common.js: successful requests (a Counter)
FAILED_METRIC = "protolab_req_failed"  # one sample per attempt, non-zero when it failed (a Rate)
POLL_TIMEOUT_S = 0.5
BACKENDS_WITH_K6_HERE = ("local",)


@dataclass(frozen=True)
class Window:
    """One measured k6 run about to start: its scenario, planned length and k6's REST APIs
    (host:port, one per instance; empty when they cannot be reached from here)."""

    scenario_id: str
    total_s: float
    api_addresses: tuple[str, ...]


@dataclass(frozen=True)
class Counts:
    """k6's counts so far, summed over its instances; errors None when every request so far failed
    (the API gives a Rate's share only, and the count comes from the successes beside it)."""

    requests: int
    requests_per_second: float
    errors: int | None


Watch = Callable[[Window], AbstractContextManager[None]]
"""What shows a window while it runs (cli/live.py's terminal line); entered around the k6 run."""


def free_port() -> int:
    """A TCP port on API_HOST that nothing listens on now (k6 binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((API_HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def api_addresses(invocation: K6Invocation) -> tuple[str, ...]:
    """Where an invocation's k6 processes serve their REST API (its --address values), if anywhere."""
    runs = invocation.instances or (invocation,)
    found = []
    for run in runs:
        args = list(run.args)
        address = args[args.index("--address") + 1] if "--address" in args else ""
        if address:
            found.append(address)
    return tuple(found)


def poll(addresses: Sequence[str]) -> Counts | None:
    """The counts so far from every instance's API; None until all of them answer."""
    totals = Counts(0, 0.0, 0)
    for address in addresses:
        requests = _sample(address, REQUESTS_METRIC)
        if requests is None:
            return None
        succeeded = int(requests.get("count") or 0)
        errors = _errors(succeeded, (_sample(address, FAILED_METRIC) or {}).get("rate"))
        totals = Counts(
            totals.requests + succeeded,
            totals.requests_per_second + float(requests.get("rate") or 0.0),
            None if errors is None or totals.errors is None else totals.errors + errors,
        )
    return totals


def _errors(succeeded: int, failed_share: float | None) -> int | None:
    """Failed requests from the successes and the failed share of all attempts: s * r / (1 - r)."""
    if not failed_share:
        return 0
    if failed_share >= 1:
        return None
    return round(succeeded * failed_share / (1 - failed_share))


def _sample(address: str, metric: str) -> dict[str, float] | None:
    """A metric's current sample ({"count", "rate"} for a Counter, {"rate"} for a Rate); None when k6 has not
    served it yet (starting up, no sample so far) or is gone."""
    try:
        with urllib.request.urlopen(f"http://{address}/v1/metrics/{metric}", timeout=POLL_TIMEOUT_S) as r:
            body = json.load(r)
    except (OSError, ValueError):
        return None
    sample = ((body.get("data") or {}).get("attributes") or {}).get("sample")
    return sample if isinstance(sample, dict) else None
