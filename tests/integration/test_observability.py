"""Real local Prometheus and InfluxDB started by labrunner.observe.local_stack on free ports."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.observe import influx_auth, local_stack, prometheus_sd
from labrunner.observe.labels import INFLUXDB_DATABASE

from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.parallel,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("influxd") and shutil.which("promtool")),
        reason="prometheus, promtool and influxd are needed",
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(params)}", timeout=5) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path, Path]]:
    """(urls, state dir, targets dir) of a running local Prometheus + InfluxDB."""
    root = tmp_path_factory.mktemp("obs")
    state_dir, targets_dir = root / "state", root / "targets"
    ports = local_stack.Ports(prometheus=free_port(), influxdb=free_port(), influxdb_rpc=free_port())
    urls = local_stack.start(state_dir, targets_dir=targets_dir, ports=ports)
    try:
        yield urls, state_dir, targets_dir
    finally:
        local_stack.stop(state_dir)


def test_promtool_accepts_shared_and_derived_config(lab: tuple[dict[str, str], Path, Path]) -> None:
    _, state_dir, _ = lab
    for config in (local_stack.PROMETHEUS_YML, state_dir / "prometheus.yml"):
        result = subprocess.run(
            ["promtool", "check", "config", str(config)], check=False, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_derived_config_only_moves_paths(lab: tuple[dict[str, str], Path, Path]) -> None:
    urls, state_dir, targets_dir = lab
    shared = yaml.safe_load(local_stack.PROMETHEUS_YML.read_text())
    derived = yaml.safe_load((state_dir / "prometheus.yml").read_text())
    assert derived["global"] == shared["global"]
    jobs = {job["job_name"]: job for job in derived["scrape_configs"]}
    assert jobs["protolab-services"]["file_sd_configs"][0]["files"] == [str(targets_dir.resolve() / "*.json")]
    assert jobs["prometheus"]["static_configs"][0]["targets"] == [urls["prometheus"].removeprefix("http://")]


class MetricsServer:
    """Serves a Prometheus text exposition at /metrics: `body`, which a test may replace."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_prometheus_scrapes_file_sd_target(lab: tuple[dict[str, str], Path, Path]) -> None:
    urls, _, targets_dir = lab
    server = MetricsServer(b"protolab_fake_metric 42\n")
    try:
        labels = {"run": "r1", "scenario": "sd-test", "service": "fake"}
        (targets_dir / "sd-test.json").write_text(
            json.dumps([{"targets": [server.address], "labels": labels}])
        )
        deadline = time.monotonic() + 30
        result: list[Any] = []
        while not result and time.monotonic() < deadline:
            time.sleep(0.5)
            query = get_json(
                f"{urls['prometheus']}/api/v1/query", query='protolab_fake_metric{scenario="sd-test"}'
            )
            result = query["data"]["result"]
        assert result, "Prometheus never scraped the file_sd target"
        assert result[0]["value"][1] == "42"
        assert result[0]["metric"]["job"] == "protolab-services"
        assert result[0]["metric"]["service"] == "fake"
    finally:
        (targets_dir / "sd-test.json").unlink(missing_ok=True)
        server.close()


def test_the_wait_after_a_window_returns_once_prometheus_holds_the_final_value(
    lab: tuple[dict[str, str], Path, Path],
) -> None:
    """What the runner relies on before it stops a service: its last counters are in Prometheus."""
    urls, _, targets_dir = lab
    server = MetricsServer(b"protolab_fake_total 1\n")
    overrides = Overrides(targets=("grpc",))
    [scenario] = expand(load_matrix(ROOT / "matrix.toml"), "local", "ci", overrides).scenarios
    try:
        write_json_atomic(
            targets_dir / "final.json",
            [{"targets": [server.address], "labels": prometheus_sd.labels("r-final", scenario)}],
        )
        assert prometheus_sd.wait_scraped_after(urls["prometheus"], "r-final", scenario, 0, 30) is None
        server.body = b"protolab_fake_total 2\n"  # the window's last requests
        assert (
            prometheus_sd.wait_scraped_after(urls["prometheus"], "r-final", scenario, time.time(), 10) is None
        )
        query = get_json(
            f"{urls['prometheus']}/api/v1/query", query=f'protolab_fake_total{{scenario="{scenario.id}"}}'
        )
        assert [r["value"][1] for r in query["data"]["result"]] == ["2"]
    finally:
        (targets_dir / "final.json").unlink(missing_ok=True)
        server.close()
    problem = prometheus_sd.wait_scraped_after(urls["prometheus"], "r-final", scenario, time.time() + 60, 0)
    assert problem is not None and "did not" in problem


def test_influxdb_has_k6_database(lab: tuple[dict[str, str], Path, Path]) -> None:
    urls, _, _ = lab
    databases = get_json(f"{urls['influxdb']}/query", q="SHOW DATABASES")["results"][0]["series"][0]["values"]
    assert [INFLUXDB_DATABASE] in databases


def test_start_is_idempotent_and_status_reports(lab: tuple[dict[str, str], Path, Path]) -> None:
    urls, state_dir, _ = lab
    assert local_stack.start(state_dir) == urls
    status = local_stack.status(state_dir)
    assert {name: proc["running"] for name, proc in status.items()} == {"prometheus": True, "influxdb": True}


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = local_stack.Ports(prometheus=port, influxdb=free_port(), influxdb_rpc=free_port())
        with pytest.raises(
            local_stack.ObservabilityError, match=f"Prometheus port 127.0.0.1:{port} is in use"
        ):
            local_stack.start(tmp_path, ports=ports)


def test_a_port_a_run_before_left_in_time_wait_is_free(tmp_path: Path) -> None:
    """Two runs back to back: the first one's Prometheus closed its connections, so its port waits in
    TIME_WAIT; the second run's own Prometheus must start on it all the same."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its end of the port waits in TIME_WAIT
        client.close()
    with socket.socket() as plain, pytest.raises(OSError):  # the state the run before leaves
        plain.bind(("127.0.0.1", port))
    ports = local_stack.Ports(prometheus=port, influxdb=free_port(), influxdb_rpc=free_port())
    state_dir = tmp_path / "state"
    try:
        urls = local_stack.start(state_dir, targets_dir=tmp_path / "targets", ports=ports)
        assert urls["prometheus"].endswith(f":{port}")
    finally:
        local_stack.stop(state_dir)


def test_cli_start_status_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_PROMETHEUS_PORT", str(free_port()))
    monkeypatch.setenv("LAB_INFLUXDB_PORT", str(free_port()))
    monkeypatch.setenv("LAB_INFLUXDB_RPC_PORT", str(free_port()))
    cli = [sys.executable, str(local_stack.REPO / "scripts" / "local_obs.py")]
    args = ["--dir", str(tmp_path / "state"), "--targets-dir", str(tmp_path / "targets")]
    try:
        started = subprocess.run(
            [*cli, "start", *args], check=False, capture_output=True, text=True, timeout=60
        )
        assert started.returncode == 0, started.stderr
        assert "influxdb: http://127.0.0.1:" in started.stdout
        status = subprocess.run(
            [*cli, "status", *args], check=False, capture_output=True, text=True, timeout=30
        )
        assert all(proc["running"] for proc in json.loads(status.stdout).values())
    finally:
        stopped = subprocess.run(
            [*cli, "stop", *args], check=False, capture_output=True, text=True, timeout=60
        )
    assert stopped.returncode == 0, stopped.stderr
    assert local_stack.status(tmp_path / "state") == {}


def test_prometheus_cannot_be_stopped_or_reloaded_over_http(lab: tuple[dict[str, str], Path, Path]) -> None:
    """Without --web.enable-lifecycle, anyone who reaches the port is refused /-/quit and /-/reload;
    the runner stops its Prometheus by signal (local_stack.stop)."""
    urls, _, _ = lab
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for action in ("quit", "reload"):
        request = urllib.request.Request(f"{urls['prometheus']}/-/{action}", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=10)
        assert refused.value.code == 403, action
    with opener.open(f"{urls['prometheus']}/-/ready", timeout=10) as response:
        assert response.status == 200


def _status(url: str, statement: str, auth: influx_auth.Credentials | None, path: str = "/query") -> int:
    """The HTTP status of an InfluxQL statement (or a line-protocol write to /write) as auth;
    a refusal InfluxQL reports inside a 200 counts as 403."""
    body = statement.encode() if path == "/write" else urllib.parse.urlencode({"q": statement}).encode()
    request = urllib.request.Request(f"{url}{path}?db={INFLUXDB_DATABASE}", data=body)
    if auth is not None:
        request.add_header("Authorization", auth.basic())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return 403 if b'"error"' in response.read() else response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_with_the_users_of_env_influxdb_has_auth_and_keeps_it_across_restarts(tmp_path: Path) -> None:
    """What a run (and `local_obs.py start`) does when .env has the three passwords: compose's users."""
    env_file = tmp_path / ".env"
    influx_auth.ensure_passwords(env_file, ROOT / ".env.example")
    users = influx_auth.users({}, env_file)
    assert users is not None
    state = tmp_path / "state"
    for start in ("first", "again, on the same data"):
        # Fresh ports: the stopped ones may linger in TIME_WAIT.
        ports = local_stack.Ports(prometheus=free_port(), influxdb=free_port(), influxdb_rpc=free_port())
        url = local_stack.start(state, targets_dir=tmp_path / "targets", ports=ports, users=users)["influxdb"]
        try:
            assert _status(url, "SHOW DATABASES", None) == 401, start
            assert _status(url, "probe value=1", None, "/write") == 401, start
            assert _status(url, "probe value=1", users.writer, "/write") == 204, start
            assert _status(url, 'SELECT * FROM "probe"', users.writer) == 403, start
            assert _status(url, 'SELECT * FROM "probe"', users.reader) == 200, start
            assert _status(url, "probe value=2", users.reader, "/write") == 403, start
            assert _status(url, "DROP DATABASE myk6db", users.reader) == 403, start
        finally:
            local_stack.stop(state)
    # An admin password other than the data's: a clear refusal, not a half-started stack.
    wrong = influx_auth.Users(
        influx_auth.Credentials(influx_auth.ADMIN, "not-the-password"), users.writer, users.reader
    )
    ports = local_stack.Ports(prometheus=free_port(), influxdb=free_port(), influxdb_rpc=free_port())
    with pytest.raises(local_stack.ObservabilityError, match="INFLUXDB_ADMIN_PASSWORD"):
        local_stack.start(state, targets_dir=tmp_path / "targets", ports=ports, users=wrong)
    assert local_stack.status(state) == {}
