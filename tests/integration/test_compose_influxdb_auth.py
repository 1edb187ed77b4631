"""docker-compose.yml's InfluxDB with auth, run natively: influxd with compose's environment and the
users its image's init script creates from it, then what each client can do as compose configures
it. Anonymous: nothing. The writer (k6 and the runner's annotations): write, not read. The reader
(Grafana's data source and the health check): read, not write. The health check itself.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrunner.model.matrix import expand, load_matrix
from labrunner.observe import annotations, influx_auth

from tests.compose_file import REQUIRED_ENV, compose
from tests.integration.compose_support import LOOPBACK
from tests.support import ROOT, free_ports

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

DATABASE = "myk6db"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Influx:
    url: str
    environment: dict[str, str]  # compose's influxdb environment, resolved
    health_check: list[str]  # the compose health check, pointed at this influxd

    def user(self, role: str) -> tuple[str, str]:
        """compose's INFLUXDB_<role>_USER and its password (ADMIN's is INFLUXDB_ADMIN_PASSWORD)."""
        password = "INFLUXDB_ADMIN_PASSWORD" if role == "ADMIN" else f"INFLUXDB_{role}_USER_PASSWORD"
        return self.environment[f"INFLUXDB_{role}_USER"], self.environment[password]

    def request(self, path: str, params: dict[str, str], body: bytes | None = None, auth: Any = None) -> int:
        """The HTTP status of a request, as `auth` (a (user, password) pair) or anonymously."""
        request = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(params)}", data=body)
        if auth is not None:
            request.add_header("Authorization", influx_auth.Credentials(*auth).basic())
        try:
            with _OPENER.open(request, timeout=10) as response:
                status: int = response.status
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code
        # InfluxQL answers 200 with the refusal inside; count that as the refusal it is.
        return 403 if '"error"' in text else status

    def query(self, q: str, auth: Any = None) -> int:
        return self.request(
            "/query", {"db": DATABASE, "q": q}, body=urllib.parse.urlencode({"q": q}).encode(), auth=auth
        )

    def write(self, line: str, auth: Any = None) -> int:
        return self.request("/write", {"db": DATABASE}, body=line.encode(), auth=auth)

    def healthy(self, **env: str) -> bool:
        run = subprocess.run(
            self.health_check, env={**os.environ, **self.environment, **env}, check=False, timeout=10
        )
        return run.returncode == 0


def _init_like_the_image(influx: Influx) -> None:
    """What the image's init script does on first start with compose's environment (the official
    influxdb:1.8 script, and tests/docker/images/influxdb/init-influxdb.sh): the admin first (the
    only thing InfluxDB accepts while no admin exists), then as the admin the database, and the
    writer and reader with WRITE and READ on it."""
    env = influx.environment
    admin, admin_password = influx.user("ADMIN")
    steps = [
        (f"CREATE USER \"{admin}\" WITH PASSWORD '{admin_password}' WITH ALL PRIVILEGES", None),
        (f"CREATE DATABASE {env['INFLUXDB_DB']}", (admin, admin_password)),
    ]
    for role in ("WRITE", "READ"):
        user, password = influx.user(role)
        steps += [
            (f"CREATE USER \"{user}\" WITH PASSWORD '{password}'", (admin, admin_password)),
            (f'GRANT {role} ON "{env["INFLUXDB_DB"]}" TO "{user}"', (admin, admin_password)),
        ]
    for statement, auth in steps:
        assert influx.query(statement, auth=auth) == 200, statement


@pytest.fixture(scope="module")
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Influx]:
    """influxd from influxdb/influxdb.conf with compose's influxdb environment (auth on), before init."""
    assert shutil.which("influxd") and shutil.which("curl"), "needs influxd and curl: run scripts/setup.sh"
    service = compose()["services"]["influxdb"]
    environment = {key: str(value) for key, value in service["environment"].items()}
    assert environment["INFLUXDB_HTTP_AUTH_ENABLED"] == "true"
    directory = tmp_path_factory.mktemp("influxdb")
    http_port, rpc_port = free_ports(2)
    env = {
        **os.environ,
        **environment,
        **{f"INFLUXDB_{key}_DIR": str(directory / key.lower()) for key in ("META", "DATA", "DATA_WAL")},
        "INFLUXDB_HTTP_BIND_ADDRESS": f"{LOOPBACK}:{http_port}",
        "INFLUXDB_BIND_ADDRESS": f"{LOOPBACK}:{rpc_port}",
    }
    argv = ["influxd", "-config", str(ROOT / "influxdb" / "influxdb.conf")]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kind, check = service["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and "127.0.0.1:8086/" in check
    url = f"http://{LOOPBACK}:{http_port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _OPENER.open(f"{url}/ping", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "influxd did not start"
                time.sleep(0.1)
        native_check = ["sh", "-c", check.replace("127.0.0.1:8086/", f"{LOOPBACK}:{http_port}/")]
        yield Influx(url, environment, native_check)
    finally:
        process.terminate()
        process.wait(timeout=15)


@pytest.fixture(scope="module")
def initialised(influx: Influx) -> Influx:
    assert not influx.healthy(), "healthy before its users and k6's database exist"
    _init_like_the_image(influx)
    return influx


def test_health_check_passes_as_the_reader_only(initialised: Influx) -> None:
    assert initialised.healthy()
    assert not initialised.healthy(INFLUXDB_READ_USER_PASSWORD="not-the-password")
    # The password reaches curl on stdin, never on a command line `ps` shows every user.
    assert "$INFLUXDB_READ_USER_PASSWORD" in initialised.health_check[-1]
    assert "-u " not in initialised.health_check[-1] and " -K -" in initialised.health_check[-1]


def test_anonymous_clients_can_neither_read_nor_write(initialised: Influx) -> None:
    assert initialised.query("SHOW DATABASES") == 401
    assert initialised.query(f'SELECT * FROM "{annotations.MEASUREMENT}"') == 401
    assert initialised.write("probe value=1") == 401
    assert initialised.query("DROP DATABASE myk6db") == 401


def test_the_writer_writes_and_cannot_read_or_drop(initialised: Influx) -> None:
    writer = initialised.user("WRITE")
    assert writer[0] == influx_auth.WRITER  # the user the runner and compose's k6 log in as
    assert initialised.write("probe value=1", auth=writer) == 204
    assert initialised.query('SELECT * FROM "probe"', auth=writer) == 403
    assert initialised.query("DROP DATABASE myk6db", auth=writer) == 403
    assert initialised.write("probe value=1", auth=(writer[0], "not-the-password")) == 401


def test_the_reader_reads_and_cannot_write(initialised: Influx) -> None:
    reader = initialised.user("READ")
    assert initialised.write("probe value=2", auth=reader) == 403
    assert initialised.query('SELECT * FROM "probe"', auth=reader) == 200
    assert initialised.query('SELECT * INTO "copy" FROM "probe"', auth=reader) == 403
    assert initialised.query('DROP MEASUREMENT "probe"', auth=reader) == 403
    assert initialised.query("DROP DATABASE myk6db", auth=reader) == 403


def test_grafana_and_k6_log_in_as_the_reader_and_the_writer() -> None:
    services = compose()["services"]
    influxdb, grafana, k6 = (services[name]["environment"] for name in ("influxdb", "grafana", "k6"))
    sources = yaml.safe_load(
        (ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text()
    )
    assert sources["datasources"], "no data source: the checks below would check nothing"
    for source in sources["datasources"]:
        assert source["editable"] is False, source["name"]  # nobody changes them through Grafana
    [influx_source] = [s for s in sources["datasources"] if s["type"] == "influxdb"]
    assert influx_source["user"] == influxdb["INFLUXDB_READ_USER"]
    # Grafana expands $VARIABLE from its environment, which compose fills with the reader's password.
    variable = influx_source["secureJsonData"]["password"].removeprefix("$")
    assert (
        grafana[variable] == influxdb["INFLUXDB_READ_USER_PASSWORD"] == REQUIRED_ENV["INFLUXDB_READ_PASSWORD"]
    )
    assert k6["K6_INFLUXDB_USERNAME"] == influxdb["INFLUXDB_WRITE_USER"]
    assert k6["K6_INFLUXDB_PASSWORD"] == influxdb["INFLUXDB_WRITE_USER_PASSWORD"]


def test_the_runners_annotations_write_as_the_writer(
    initialised: Influx, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scenario = expand(load_matrix(ROOT / "matrix.toml"), "local", "ci").scenarios[0]
    monkeypatch.delenv(influx_auth.PASSWORD_VARIABLE, raising=False)
    monkeypatch.setattr(influx_auth, "ENV_FILE", tmp_path / "no.env")
    assert annotations.mark(initialised.url, "auth-run", scenario, "start") is not None, (
        "written without a password"
    )
    # What setup.sh leaves in .env, read as the runner reads it.
    env_file = tmp_path / ".env"
    env_file.write_text(f"{influx_auth.PASSWORD_VARIABLE}={initialised.user('WRITE')[1]}\n")
    monkeypatch.setattr(influx_auth, "ENV_FILE", env_file)
    assert annotations.mark(initialised.url, "auth-run", scenario, "start") is None
    reader = initialised.user("READ")
    q = f'SELECT count("event") FROM "{annotations.MEASUREMENT}" WHERE "run" = \'auth-run\''
    params = {"db": DATABASE, "q": q}
    request = urllib.request.Request(f"{initialised.url}/query?{urllib.parse.urlencode(params)}")
    request.add_header("Authorization", influx_auth.Credentials(*reader).basic())
    with _OPENER.open(request, timeout=10) as response:
        answer = response.read().decode()
    assert '"values":[[' in answer and ",1]]" in answer, answer


def _count(influx: Influx, measurement: str, tag: str) -> int:
    user, password = influx.user("READ")
    q = f'SELECT count("value") FROM "{measurement}" WHERE "probe" = \'{tag}\''
    request = urllib.request.Request(f"{influx.url}/query?{urllib.parse.urlencode({'db': DATABASE, 'q': q})}")
    request.add_header("Authorization", influx_auth.Credentials(user, password).basic())
    with _OPENER.open(request, timeout=10) as response:
        series = json.load(response)["results"][0].get("series", [])
    return int(series[0]["values"][0][1]) if series else 0


def test_k6_writes_its_samples_as_the_writer_from_its_environment(
    initialised: Influx, tmp_path: Path
) -> None:
    """The real k6 with what the runner gives it (Credentials.k6_env) and what compose gives its k6."""
    k6 = shutil.which("k6", path=str(ROOT / ".venv" / "bin")) or shutil.which("k6")
    assert k6, "needs k6: run scripts/setup.sh"
    script = tmp_path / "probe.js"
    script.write_text("export const options = { iterations: 3, vus: 1 };\nexport default function () {}\n")
    writer = influx_auth.Credentials(*initialised.user("WRITE"))

    def run(tag: str, env: dict[str, str]) -> None:
        argv = [k6, "run", "--quiet", "--no-color", "--address", "", "--tag", f"probe={tag}",
                "--out", f"influxdb={initialised.url}/{DATABASE}", str(script)]  # fmt: skip
        clean = {k: v for k, v in os.environ.items() if not k.startswith("K6_")}
        subprocess.run(argv, env={**clean, "K6_NO_USAGE_REPORT": "true", **env}, check=False, timeout=120)

    run("with-password", writer.k6_env())
    run("without-password", {})
    assert _count(initialised, "iterations", "with-password") == 3
    assert _count(initialised, "iterations", "without-password") == 0
