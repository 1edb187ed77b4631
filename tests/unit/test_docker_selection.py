"""Choosing the docker backend: `auto` takes it when the engine answers and the lab is up, else local
with the reason in words; `--backend docker` without an engine, or with one older than 25, is refused."""

import re
import socket
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound
from labrunner import backends
from labrunner.backends.base import BackendUnavailable
from labrunner.cli import run_matrix as cli

from tests.docker_fake import FakeDocker, settings

pytestmark = pytest.mark.usefixtures("docker_quick_polls")


# --- Choosing the backend ----------------------------------------------------------------------


def test_auto_picks_docker_when_the_engine_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDocker()
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    assert backends.choose("auto") == ("docker", "auto: Docker engine 27.5.1 answers and the lab is up")
    assert fake.calls == [("network", "protolab"), ("close",)]
    assert backends.choose("local") == ("local", "requested")


def test_auto_takes_local_when_the_engine_answers_but_the_lab_is_not_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Docker installed for other reasons: the README's main command must still run, locally.
    fake = FakeDocker()

    def missing(name: str) -> None:
        raise NotFound(name)

    fake.networks.get = missing
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    assert backends.choose("auto") == (
        "local",
        "auto: Docker engine 27.5.1 answers but the lab is not up (no protolab network): "
        "run `docker compose up -d`",
    )
    assert ("close",) in fake.calls


def test_auto_falls_back_to_local_and_says_why_in_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real SDK against a socket that is not there, then one nobody listens on: the reason is
    # a sentence, not the SDK's wrapped exception ("Error while fetching server API version: ...").
    missing = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", missing)
    assert cli.main(["--dry-run", "--target", "grpc"]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line == (
        f"backend: local (auto): no Docker engine answered at {missing} (no socket at that path)"
    )
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(tmp_path / "refusing.sock"))  # bound, never listening: connect is refused
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/refusing.sock")
        assert backends.choose("auto") == (
            "local",
            f"auto: no Docker engine answered at unix://{tmp_path}/refusing.sock (connection refused)",
        )


def test_backend_docker_without_an_engine_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real SDK against a socket nobody listens on.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    socket_url = f"unix://{tmp_path}/no-engine.sock"
    with pytest.raises(
        BackendUnavailable,
        match=rf"^--backend docker: service engine local \({re.escape(socket_url)}\) did not answer: "
        "no socket at that path; start Docker or use --backend local$",
    ):
        backends.create("docker", settings(tmp_path))
    argv = ["--backend", "docker", "--target", "grpc", "--k6", "/bin/true", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert "run_matrix.py: error: --backend docker: service engine local" in capsys.readouterr().err


def test_an_engine_older_than_25_is_refused_with_what_the_lab_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDocker()
    fake.version_answer = "20.10.24+dfsg1"
    monkeypatch.setattr(docker, "from_env", lambda timeout: fake)
    reason = "Docker engine 20.10.24+dfsg1 answered, but the lab needs Engine 25.0 or newer"
    refused = rf"^--backend docker: service engine local .*: {re.escape(reason)}"
    with pytest.raises(BackendUnavailable, match=refused):
        backends.create("docker", settings(Path("/nonexistent")))
    name, why = backends.choose("auto")
    assert (name, why.startswith(f"auto: {reason}")) == ("local", True)
