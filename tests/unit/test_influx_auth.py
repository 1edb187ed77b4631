"""InfluxDB's credentials on the runner's side: setup.sh's generated passwords in .env, read back as
the runner and compose read them."""

import stat
from pathlib import Path

from labrunner.observe import influx_auth

from tests.compose_file import compose
from tests.support import ROOT


def test_setup_generates_each_password_once_into_a_private_copy_of_the_example(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    generated = influx_auth.ensure_passwords(env_file, ROOT / ".env.example")
    assert generated == list(influx_auth.PASSWORD_VARIABLES)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = influx_auth.read_env_file(env_file)
    passwords = [values[name] for name in influx_auth.PASSWORD_VARIABLES]
    assert len(set(passwords)) == 3 and all(len(p) >= 32 for p in passwords), passwords
    # Everything else of the example stays as it was (the user still sets Grafana's password).
    example = influx_auth.read_env_file(ROOT / ".env.example")
    others = set(example) - set(influx_auth.PASSWORD_VARIABLES)
    assert "GRAFANA_ADMIN_PASSWORD" in others
    assert {k: values[k] for k in others} == {k: example[k] for k in others}
    # Rerun: InfluxDB keeps the passwords it first started with, so setup.sh keeps them too.
    assert influx_auth.ensure_passwords(env_file, ROOT / ".env.example") == []
    assert influx_auth.read_env_file(env_file) == values


def test_a_users_own_env_keeps_its_lines_and_gains_only_the_missing_passwords(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "# mine\nGRAFANA_ADMIN_PASSWORD='s3cret'\nINFLUXDB_READ_PASSWORD=chosen\nSUT_CPUS=1\n"
    )
    env_file.chmod(0o644)
    assert influx_auth.ensure_passwords(env_file, ROOT / ".env.example") == [
        "INFLUXDB_ADMIN_PASSWORD",
        "INFLUXDB_WRITE_PASSWORD",
    ]
    lines = env_file.read_text().splitlines()
    assert lines[:4] == [
        "# mine",
        "GRAFANA_ADMIN_PASSWORD='s3cret'",
        "INFLUXDB_READ_PASSWORD=chosen",
        "SUT_CPUS=1",
    ]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = influx_auth.read_env_file(env_file)
    assert values["GRAFANA_ADMIN_PASSWORD"] == "s3cret"  # quotes removed, as compose reads them


def test_the_runner_takes_the_writers_password_from_the_environment_first_then_env(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    assert influx_auth.writer({}, env_file) is None  # no file, no variable: an InfluxDB without auth
    env_file.write_text("INFLUXDB_WRITE_PASSWORD=from-file\n")
    assert influx_auth.writer({}, env_file) == influx_auth.Credentials("protolab_writer", "from-file")
    from_env = influx_auth.writer({"INFLUXDB_WRITE_PASSWORD": "from-env"}, env_file)
    assert from_env is not None and from_env.password == "from-env"
    assert "from-env" not in repr(from_env)  # never in a traceback or a log line
    assert from_env.k6_env() == {
        "K6_INFLUXDB_USERNAME": "protolab_writer",
        "K6_INFLUXDB_PASSWORD": "from-env",
    }
    # The user compose creates for it and gives k6.
    services = compose()["services"]
    assert services["influxdb"]["environment"]["INFLUXDB_WRITE_USER"] == influx_auth.WRITER
    assert services["k6"]["environment"]["K6_INFLUXDB_USERNAME"] == influx_auth.WRITER
