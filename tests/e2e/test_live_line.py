"""The live line against real k6: its REST API on a free local port, polled while k6 loads a real
server, and the terminal line that shows it."""

import io
import os
import re
import subprocess
import time

import pytest
from labrunner.cli import live as live_line
from labrunner.run import live
from labrunner.run.live import Window

from tests.e2e.k6_servers import K6_DIR, RecordsServer, k6_binary, rest_env

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(120)]  # answers checked, nothing measured
SECONDS = 3


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _start_k6(server: RecordsServer, address: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "K6_NO_USAGE_REPORT": "true",
        "DURATION": f"{SECONDS}s",
        "VUS": "2",
        **rest_env(server),
    }
    return subprocess.Popen(
        [k6_binary(), "run", "--quiet", "--no-color", "--address", address, str(K6_DIR / "rest.js")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_k6_instances_polled_and_shown_while_they_run() -> None:
    addresses = tuple(f"{live.API_HOST}:{live.free_port()}" for _ in range(2))
    terminal = _Terminal()
    watch = live_line.watch_for(terminal)
    assert watch is not None
    polled: list[live.Counts] = []
    with RecordsServer() as server:
        processes = [_start_k6(server, address) for address in addresses]
        with watch(Window("rest.local.c7.closed.r1", SECONDS, addresses)):
            deadline = time.monotonic() + SECONDS + 30
            while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
                counts = live.poll(addresses)
                if counts is not None:
                    polled.append(counts)
                time.sleep(0.5)
        for process in processes:
            assert process.wait(timeout=30) == 0, process.stderr.read() if process.stderr else ""
    assert polled, "k6's REST API never answered"
    last = polled[-1]
    assert last.requests_per_second > 0 and last.requests > 0 and last.errors == 0
    # The two instances' total grows while they run.
    assert polled[0].requests <= last.requests
    shown = [float(n.replace(",", "")) for n in re.findall(r"([\d,]+) req/s, 0 errors", terminal.getvalue())]
    assert shown and max(shown) > 0, terminal.getvalue()
    assert f"/{SECONDS} s" in terminal.getvalue()


def test_no_api_no_counts() -> None:
    assert live.poll((f"{live.API_HOST}:{live.free_port()}",)) is None  # nothing listens: no numbers
