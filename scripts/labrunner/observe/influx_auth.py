"""InfluxDB's credentials on the runner's side: the writer compose creates, whose password
scripts/setup.sh generates into .env (docs/docker.md, "InfluxDB's users")."""

import base64
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labrunner.paths import REPO

# docker-compose.yml's INFLUXDB_ADMIN_USER, INFLUXDB_WRITE_USER (WRITE on myk6db only) and
# INFLUXDB_READ_USER (READ on it); the local backend's InfluxDB makes the same three.
ADMIN, WRITER, READER = "protolab_admin", "protolab_writer", "protolab_reader"
PASSWORD_VARIABLE = "INFLUXDB_WRITE_PASSWORD"
# The admin's, the writer's and the reader's passwords, as .env and compose name them.
PASSWORD_VARIABLES = ("INFLUXDB_ADMIN_PASSWORD", PASSWORD_VARIABLE, "INFLUXDB_READ_PASSWORD")
ENV_FILE = REPO / ".env"
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(.*)$")


@dataclass(frozen=True)
class Credentials:
    """A user and password InfluxDB 1.x takes as HTTP basic auth (k6: K6_INFLUXDB_USERNAME/PASSWORD)."""

    username: str
    password: str = field(repr=False)  # never in a traceback or a log line

    def basic(self) -> str:
        """The Authorization header's value."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"

    def k6_env(self) -> dict[str, str]:
        """What k6's InfluxDB output reads; environment, not arguments, which `ps` shows everyone."""
        return {"K6_INFLUXDB_USERNAME": self.username, "K6_INFLUXDB_PASSWORD": self.password}


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as compose reads .env (comments and blank lines skipped, one layer of
    matching quotes removed); a missing file is empty."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        match = _ASSIGNMENT.match(line)
        if match is None:
            continue
        value = match[2].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[match[1]] = value
    return values


@dataclass(frozen=True)
class Users:
    """The three users and their passwords."""

    admin: Credentials
    writer: Credentials
    reader: Credentials


def users(environ: Mapping[str, str] | None = None, env_file: Path | None = None) -> Users | None:
    """The three users with the passwords of the environment, else of .env; None unless all three
    have one (then an InfluxDB the lab starts runs without auth)."""
    values = {**read_env_file(env_file or ENV_FILE), **(os.environ if environ is None else environ)}
    admin, writer, reader = (values.get(name, "") for name in PASSWORD_VARIABLES)
    if not (admin and writer and reader):
        return None
    return Users(Credentials(ADMIN, admin), Credentials(WRITER, writer), Credentials(READER, reader))


def writer(environ: Mapping[str, str] | None = None, env_file: Path | None = None) -> Credentials | None:
    """The writer's credentials: INFLUXDB_WRITE_PASSWORD from the environment, else from .env;
    None when neither has one (an InfluxDB without auth, as the local backend starts)."""
    environ = os.environ if environ is None else environ
    password = environ.get(PASSWORD_VARIABLE) or read_env_file(env_file or ENV_FILE).get(PASSWORD_VARIABLE)
    return Credentials(WRITER, password) if password else None


ENV_EXAMPLE = REPO / ".env.example"


def ensure_passwords(env_file: Path = ENV_FILE, example: Path = ENV_EXAMPLE) -> list[str]:
    """Give each of PASSWORD_VARIABLES a generated password in env_file where it has none; the
    variables set. env_file starts as a copy of example, and is left readable by its owner only.
    A password already there is kept: InfluxDB keeps the one it was first started with."""
    if not env_file.exists():
        write_private(env_file, example.read_text())
    lines = env_file.read_text().splitlines()
    values = read_env_file(env_file)
    generated = [name for name in PASSWORD_VARIABLES if not values.get(name)]
    for name in generated:
        assignment = f"{name}={secrets.token_urlsafe(24)}"
        at = next(
            (i for i, line in enumerate(lines) if (m := _ASSIGNMENT.match(line)) and m[1] == name), None
        )
        if at is None:
            lines.append(assignment)
        else:
            lines[at] = assignment
    write_private(env_file, "\n".join(lines) + "\n")
    return generated


def write_private(path: Path, text: str) -> None:
    """Write path as its owner's alone (0600), replacing it whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
