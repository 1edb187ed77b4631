"""Local Prometheus and InfluxDB 1.x processes for the local backend, sharing the docker config files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from labrunner.observe import influx_auth, lab_cpu
from labrunner.observe.labels import INFLUXDB_DATABASE
from labrunner.paths import REPO
from labrunner.say import Say

PROMETHEUS_YML = REPO / "prometheus" / "prometheus.yml"
INFLUXDB_CONF = REPO / "influxdb" / "influxdb.conf"
DEFAULT_TARGETS_DIR = REPO / "prometheus" / "targets"
# Where prometheus.yml expects file_sd files (the docker mount point).
CONTAINER_TARGETS_DIR = "/etc/prometheus/targets"
HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STATE_FILE = "obs.json"
LAB_DIR = REPO / ".lab" / "obs"  # where a run's own Prometheus and InfluxDB keep their data


class ObservabilityError(RuntimeError):
    """A local observability process could not be started or reached."""


@dataclass(frozen=True)
class Ports:
    """TCP ports of the local observability processes (all bound on 127.0.0.1)."""

    prometheus: int
    influxdb: int
    influxdb_rpc: int

    @classmethod
    def from_env(cls) -> Ports:
        """Ports from LAB_PROMETHEUS_PORT, LAB_INFLUXDB_PORT, LAB_INFLUXDB_RPC_PORT or the defaults."""
        return cls(
            prometheus=int(os.environ.get("LAB_PROMETHEUS_PORT", "9090")),
            influxdb=int(os.environ.get("LAB_INFLUXDB_PORT", "8086")),
            influxdb_rpc=int(os.environ.get("LAB_INFLUXDB_RPC_PORT", "8088")),
        )


def derive_prometheus_config(targets_dir: Path, prometheus_port: int, out: Path) -> Path:
    """Write prometheus.yml with file_sd paths moved into targets_dir and the self-scrape port fixed."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [_relocate(pattern, targets_dir) for pattern in sd["files"]]
        if job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [f"{HOST}:{prometheus_port}"]}]
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def _relocate(pattern: str, targets_dir: Path) -> str:
    """Map a file_sd glob under the container's targets dir onto targets_dir."""
    path = Path(pattern)
    if str(path.parent) != CONTAINER_TARGETS_DIR:
        raise ObservabilityError(f"unexpected file_sd path {pattern!r} in {PROMETHEUS_YML}")
    return str(targets_dir.resolve() / path.name)


def start(
    directory: Path | str,
    targets_dir: Path | str = DEFAULT_TARGETS_DIR,
    ports: Ports | None = None,
    cpus: Sequence[int] = (),
    users: influx_auth.Users | None = None,
) -> dict[str, str]:
    """Start Prometheus and InfluxDB under directory, wait until ready, return their URLs.

    Idempotent: if both are already running from this directory, their URLs are returned.
    cpus: the CPUs to pin both to (taskset); empty: not pinned.
    users: InfluxDB runs with auth and these three users, as compose's does; None: without auth.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    state = _read_state(directory)
    if state and all(_running(proc) for proc in state.values()):
        return {name: proc["url"] for name, proc in state.items()}
    stop(directory)
    ports = ports or Ports.from_env()
    for name, port in (
        ("Prometheus", ports.prometheus),
        ("InfluxDB", ports.influxdb),
        ("InfluxDB RPC", ports.influxdb_rpc),
    ):
        _require_free_port(name, port)

    state = {}
    try:
        state["prometheus"] = _start_prometheus(directory, Path(targets_dir), ports.prometheus, cpus)
        _write_state(directory, state)
        state["influxdb"] = _start_influxdb(directory, ports, cpus, auth=users is not None)
        _write_state(directory, state)
        _wait_ready(directory, "prometheus", f"{state['prometheus']['url']}/-/ready")
        _wait_ready(directory, "influxdb", f"{state['influxdb']['url']}/ping")
        if users is None:
            _create_database(state["influxdb"]["url"])
        else:
            _create_users(state["influxdb"]["url"], users)
    except BaseException:
        stop(directory)
        raise
    return {name: proc["url"] for name, proc in state.items()}


def stop(directory: Path | str) -> None:
    """Terminate the processes started from directory: SIGTERM, wait, then SIGKILL."""
    directory = Path(directory).resolve()
    for proc in _read_state(directory).values():
        _terminate(proc)
    (directory / STATE_FILE).unlink(missing_ok=True)


def status(directory: Path | str) -> dict[str, dict[str, Any]]:
    """Per process: pid, url, log path and whether it is running."""
    state = _read_state(Path(directory).resolve())
    return {name: {**proc, "running": _running(proc)} for name, proc in state.items()}


def answers(url: str) -> bool:
    """Whether an HTTP GET of url succeeds within a second (an InfluxDB /ping, a Prometheus /-/ready)."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class Endpoints:
    """Where a run sends k6 samples and which Prometheus it waits on; None: not used."""

    influxdb_url: str | None
    prometheus_url: str | None
    # The daemons this run started (pinned to lab_cpu.daemon_cpus()): their CPU time is the lab's.
    lab_pids: tuple[int, ...] = ()


def for_run(
    influxdb: str,
    prometheus: str,
    backend_name: str,
    targets_dir: Path | None,
    *,
    cleanup: ExitStack,
    say: Say,
) -> Endpoints:
    """Resolve --influxdb and --prometheus; 'auto' uses what answers on 127.0.0.1 and, for the
    local backend, starts local Prometheus and InfluxDB for the run when neither does (stopped
    when `cleanup` closes)."""
    ports = Ports.from_env()
    found = {
        "influxdb": f"http://{HOST}:{ports.influxdb}",
        "prometheus": f"http://{HOST}:{ports.prometheus}",
    }
    health = {"influxdb": "/ping", "prometheus": "/-/ready"}
    requested = {"influxdb": influxdb, "prometheus": prometheus}
    urls: dict[str, str | None] = {}
    for name, value in requested.items():
        if value == "auto":
            urls[name] = found[name] if answers(found[name] + health[name]) else None
        else:
            urls[name] = None if value == "none" else value
    wanted_auto = [n for n, v in requested.items() if v == "auto" and urls[n] is None]
    lab_pids: tuple[int, ...] = ()
    if wanted_auto and backend_name == "local" and len(wanted_auto) == len(requested):
        try:
            cpus = lab_cpu.daemon_cpus()
            users = influx_auth.users()  # .env's, as compose's InfluxDB has them
            urls.update(start(LAB_DIR, targets_dir or DEFAULT_TARGETS_DIR, ports, cpus, users))
            cleanup.callback(stop, LAB_DIR)
            lab_pids = tuple(int(proc["pid"]) for proc in status(LAB_DIR).values() if proc["running"])
            pinned = f"pinned to CPU(s) {','.join(map(str, cpus))}" if cpus else "not pinned (one CPU)"
            say(
                f"observability: started Prometheus {urls['prometheus']} and InfluxDB {urls['influxdb']} "
                f"for this run, {pinned}, InfluxDB {'with' if users else 'without'} auth; they stop at "
                f"its end, data stays in {LAB_DIR} "
                "(`scripts/local_obs.py start` to look again)"
            )
        except ObservabilityError as exc:
            say(f"observability: could not start local Prometheus/InfluxDB: {exc}")
    for name, url in urls.items():
        say(f"observability: {name} {url or 'none (not used)'}")
    return Endpoints(urls["influxdb"], urls["prometheus"], lab_pids)


def _start_prometheus(directory: Path, targets_dir: Path, port: int, cpus: Sequence[int]) -> dict[str, Any]:
    targets_dir.mkdir(parents=True, exist_ok=True)
    config = derive_prometheus_config(targets_dir, port, directory / "prometheus.yml")
    argv = [
        _binary("PROMETHEUS_BIN", "prometheus"),
        f"--config.file={config}",
        f"--web.listen-address={HOST}:{port}",
        f"--storage.tsdb.path={directory / 'prometheus'}",
        # No --web.enable-lifecycle: it is stopped by signal (stop()); over HTTP anyone on the
        # host could POST /-/quit to it.
    ]
    return _spawn(directory, "prometheus", argv, os.environ.copy(), f"http://{HOST}:{port}", cpus=cpus)


def _start_influxdb(directory: Path, ports: Ports, cpus: Sequence[int], *, auth: bool) -> dict[str, Any]:
    data = directory / "influxdb"
    # influxd 1.x: environment variables override the shared config file.
    env = {
        **os.environ,
        "INFLUXDB_HTTP_AUTH_ENABLED": "true" if auth else "false",
        "INFLUXDB_HTTP_BIND_ADDRESS": f"{HOST}:{ports.influxdb}",
        "INFLUXDB_BIND_ADDRESS": f"{HOST}:{ports.influxdb_rpc}",
        "INFLUXDB_META_DIR": str(data / "meta"),
        "INFLUXDB_DATA_DIR": str(data / "data"),
        "INFLUXDB_DATA_WAL_DIR": str(data / "wal"),
    }
    argv = [_binary("INFLUXD_BIN", "influxd"), "-config", str(INFLUXDB_CONF)]
    return _spawn(directory, "influxdb", argv, env, f"http://{HOST}:{ports.influxdb}", cpus=cpus)


def _binary(env_var: str, name: str) -> str:
    binary = os.environ.get(env_var) or shutil.which(name)
    if not binary:
        raise ObservabilityError(f"{name} not found: install it or set {env_var}")
    return binary


def _spawn(
    directory: Path, name: str, argv: list[str], env: dict[str, str], url: str, *, cpus: Sequence[int]
) -> dict[str, Any]:
    log = directory / f"{name}.log"
    # taskset sets the affinity before exec, so every thread the daemon starts inherits it; the
    # pid and /proc/<pid>/cmdline are then the daemon's own (taskset execs it).
    pinned = (
        [_binary("TASKSET_BIN", "taskset"), "--cpu-list", ",".join(map(str, cpus)), *argv] if cpus else argv
    )
    with log.open("ab") as out:
        # Own session: a Ctrl-C meant for the caller does not kill the lab's backends.
        proc = subprocess.Popen(pinned, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return {"pid": proc.pid, "url": url, "log": str(log), "argv": argv}


def _require_free_port(name: str, port: int) -> None:
    """ObservabilityError when something listens on the port. SO_REUSEADDR, as Prometheus and InfluxDB
    bind with it: the connections a run before this one closed leave the port in TIME_WAIT for a
    minute, which stops neither daemon and must not stop the next run's observability either."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise ObservabilityError(
                f"{name} port {HOST}:{port} is in use ({exc.strerror}); stop whatever holds it "
                "or choose another port (LAB_PROMETHEUS_PORT, LAB_INFLUXDB_PORT, LAB_INFLUXDB_RPC_PORT)"
            ) from exc


def _wait_ready(directory: Path, name: str, url: str) -> None:
    proc = _read_state(directory)[name]
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _running(proc):
            exit_code = proc.get("exit_code", "unknown")
            raise ObservabilityError(
                f"{name} exited during start-up (exit code {exit_code}):\n{_log_tail(directory, name)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status < 300:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise ObservabilityError(
        f"{name} not ready at {url} after {READY_TIMEOUT_S}s:\n{_log_tail(directory, name)}"
    )


def _create_database(influx_url: str) -> None:
    # InfluxDB 1.x accepts CREATE only via POST; it is a no-op when the database exists.
    body = urllib.parse.urlencode({"q": f"CREATE DATABASE {INFLUXDB_DATABASE}"}).encode()
    with urllib.request.urlopen(f"{influx_url}/query", data=body, timeout=10) as resp:
        result = json.load(resp)
    errors = [r["error"] for r in result.get("results", []) if "error" in r]
    if errors:
        raise ObservabilityError(f"CREATE DATABASE {INFLUXDB_DATABASE} failed: {errors}")


def _create_users(influx_url: str, users: influx_auth.Users) -> None:
    """What compose's InfluxDB image does on first start, and again on each start here (the data
    outlives the process): the admin (the one statement InfluxDB takes anonymously while it has no
    admin), then as the admin the database, the writer with WRITE and the reader with READ on it,
    each with .env's password."""
    if not _admin_exists(influx_url, users.admin):
        _influxql(
            influx_url,
            f"CREATE USER {_name(users.admin)} WITH PASSWORD {_quote(users.admin)} WITH ALL PRIVILEGES",
        )
    admin = users.admin
    _influxql(influx_url, f"CREATE DATABASE {INFLUXDB_DATABASE}", admin)
    existing = _influxql(influx_url, "SHOW USERS", admin)
    for user, privilege in ((users.writer, "WRITE"), (users.reader, "READ")):
        if user.username in existing:
            _influxql(influx_url, f"SET PASSWORD FOR {_name(user)} = {_quote(user)}", admin)
        else:
            _influxql(influx_url, f"CREATE USER {_name(user)} WITH PASSWORD {_quote(user)}", admin)
        _influxql(influx_url, f"REVOKE ALL PRIVILEGES FROM {_name(user)}", admin)
        _influxql(influx_url, f'GRANT {privilege} ON "{INFLUXDB_DATABASE}" TO {_name(user)}', admin)


def _admin_exists(influx_url: str, admin: influx_auth.Credentials) -> bool:
    """Whether the data already has an admin: anonymous statements get 401 then (403, "create admin
    user first", before), and the admin must log in with .env's password."""
    try:
        _influxql(influx_url, "SHOW USERS")
    except urllib.error.HTTPError as exc:
        if exc.code == 403:
            return False
        if exc.code != 401:
            raise
    else:
        raise ObservabilityError(f"InfluxDB at {influx_url} answers without auth")
    try:
        _influxql(influx_url, "SHOW USERS", admin)
    except urllib.error.HTTPError as exc:
        raise ObservabilityError(
            f"the InfluxDB data in {LAB_DIR} has an admin whose password is not INFLUXDB_ADMIN_PASSWORD's "
            f"(HTTP {exc.code}): set it in .env, or delete the data to start again"
        ) from exc
    return True


def _influxql(influx_url: str, statement: str, auth: influx_auth.Credentials | None = None) -> str:
    """Run one statement (POST: CREATE and GRANT need it); its answer's text. An error in the answer
    raises ObservabilityError (naming the statement up to its first quote: no password), one of
    HTTP raises HTTPError."""
    request = urllib.request.Request(
        f"{influx_url}/query", data=urllib.parse.urlencode({"q": statement}).encode(), method="POST"
    )
    if auth is not None:
        request.add_header("Authorization", auth.basic())
    with urllib.request.urlopen(request, timeout=10) as resp:
        text: str = resp.read().decode()
    errors = [r["error"] for r in json.loads(text).get("results", []) if "error" in r]
    if errors:
        shown = statement.partition("'")[0].strip()
        raise ObservabilityError(f"InfluxDB refused {shown!r}: {errors}")
    return text


def _name(user: influx_auth.Credentials) -> str:
    return '"' + user.username.replace('"', '\\"') + '"'


def _quote(user: influx_auth.Credentials) -> str:
    return "'" + user.password.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _running(proc: dict[str, Any]) -> bool:
    """Is proc's pid alive and still the program we started (pids get reused)?"""
    pid = proc["pid"]
    try:
        # Reap our own exited child first, or its zombie would look alive.
        reaped, wait_status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            proc["exit_code"] = os.waitstatus_to_exitcode(wait_status)
            return False
        # Our child, unreaped: its pid cannot have been reused, so it is still the program.
        return True
    except ChildProcessError:
        pass  # started by another process (e.g. an earlier CLI call)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[:-1] == [arg.encode() for arg in proc["argv"]]


def _terminate(proc: dict[str, Any]) -> None:
    if not _running(proc):
        return
    os.kill(proc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _running(proc):
            return
        time.sleep(0.1)
    os.kill(proc["pid"], signal.SIGKILL)
    while _running(proc):
        time.sleep(0.05)


def _log_tail(directory: Path, name: str, lines: int = 20) -> str:
    log = directory / f"{name}.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _read_state(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _write_state(directory: Path, state: dict[str, dict[str, Any]]) -> None:
    tmp = directory / f"{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(directory / STATE_FILE)
