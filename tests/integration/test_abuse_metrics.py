"""The abuse suite's metrics-port case: 2,000 idle connections to a service's /metrics (served by the
supervisor, the process every worker depends on) start no thread each and lock no scrape out; the
service stays alive, under its memory limit and serving (docs/guarantees.md)."""

import contextlib
import socket
import urllib.request
from pathlib import Path

import httpx
import pytest

from tests.integration.abuse_support import confined

IDLE_CONNECTIONS = 2000
# The supervisor's threads: its main thread, the metrics thread, multiprocessing's helpers; far
# from one per connection.
MAX_THREADS = 10

pytestmark = [pytest.mark.timeout(120), pytest.mark.paired]  # a server under its CPU quota, no figure judged


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_idle_connections_to_the_metrics_port_are_bounded() -> None:
    with confined("services", "rest_aiohttp") as server, contextlib.ExitStack() as idle:
        server.reset_peak()
        metrics_port, supervisor = server.service.metrics_port, server.service.process.pid
        for _ in range(IDLE_CONNECTIONS):
            idle.enter_context(socket.create_connection(("127.0.0.1", metrics_port), timeout=10))
        text = scrape(metrics_port)  # with every idle connection still open
        during = threads(supervisor)
        peak = server.unharmed()
        print(f"\n{IDLE_CONNECTIONS} idle: supervisor threads {during}, memory peak {peak / 2**20:.0f} MiB")
        assert "protolab_workers" in text
        assert during <= MAX_THREADS, during
        response = httpx.get(f"http://127.0.0.1:{server.service.port}/healthz", timeout=10, trust_env=False)
        assert response.status_code == 200


def test_the_metrics_port_answers_only_get_of_metrics() -> None:
    with confined("services", "rest_aiohttp") as server:
        base = f"http://127.0.0.1:{server.service.metrics_port}"
        assert httpx.get(f"{base}/other", timeout=10, trust_env=False).status_code == 404
        assert httpx.post(f"{base}/metrics", timeout=10, trust_env=False).status_code == 405
        with socket.create_connection(("127.0.0.1", server.service.metrics_port), timeout=10) as oversized:
            oversized.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
            try:
                answer = oversized.recv(100)
            except ConnectionResetError:  # closed by abort (RST)
                answer = b""
            assert answer == b""  # closed, unanswered
        assert "protolab_workers" in scrape(server.service.metrics_port)
