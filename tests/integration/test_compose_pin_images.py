"""scripts/pin_images.py against a registry that speaks the distribution API's token and manifest
HEAD (a local stand-in: no registry is reachable here), on copies of docker-compose.yml and
services/Dockerfile."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "pin_images.py"
INDEX = "application/vnd.oci.image.index.v1+json"


class _Registry:
    """Tokens per repository; a manifest HEAD answers its digest only with that token and an Accept
    that names the multi-platform index."""

    def __init__(self) -> None:
        self.digests: dict[tuple[str, str], str] = {}
        self.heads: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                repository = query["scope"][0].split(":")[1]
                body = json.dumps({"token": f"token-{repository}"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                match = re.fullmatch(r"/v2/(.+)/manifests/([\w.-]+)", self.path)
                assert match is not None, self.path
                repository, tag = match.groups()
                registry.heads.append(f"{repository}:{tag}")
                authorized = self.headers["Authorization"] == f"Bearer token-{repository}"
                digest = registry.digests.get((repository, tag))
                if not authorized or INDEX not in self.headers["Accept"] or digest is None:
                    self.send_response(401 if not authorized else 404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Docker-Content-Digest", digest)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def registry() -> Iterator[_Registry]:
    stand_in = _Registry()
    yield stand_in
    stand_in.server.shutdown()


def _digest(text: str) -> str:
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def _run(registry: _Registry, files: list[Path], *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--registry", registry.url,
         "--auth", f"{registry.url}/token?service=test", *options, *map(str, files)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_every_image_is_pinned_to_the_registrys_digest_and_check_sees_a_new_one(
    registry: _Registry, tmp_path: Path
) -> None:
    compose, dockerfile = tmp_path / "docker-compose.yml", tmp_path / "Dockerfile"
    shutil.copy(ROOT / "docker-compose.yml", compose)
    shutil.copy(ROOT / "services" / "Dockerfile", dockerfile)
    images = re.findall(r"\$\{[A-Z0-9_]+_IMAGE:-([^}@]+)(?:@[^}]+)?\}", compose.read_text())
    images += re.findall(r"^ARG PYTHON_IMAGE=([^@\s]+)", dockerfile.read_text(), re.M)
    assert len(images) == 5, images  # prometheus, influxdb, grafana, k6, the services' python
    for image in images:
        name, tag = image.rsplit(":", 1)
        registry.digests[(name if "/" in name else f"library/{name}", tag)] = _digest(image)
    before = {path: path.read_text() for path in (compose, dockerfile)}

    pinned = _run(registry, [compose, dockerfile])
    assert pinned.returncode == 0, pinned.stderr
    for image in images:
        assert f"{image}@{_digest(image)}" in compose.read_text() + dockerfile.read_text(), image
    for path, text in before.items():  # nothing but the references changed
        assert re.sub(r"@sha256:[0-9a-f]{64}", "", path.read_text()) == re.sub(
            r"@sha256:[0-9a-f]{64}", "", text
        )
    assert sorted(registry.heads) == sorted(
        f"{n if '/' in n else 'library/' + n}:{t}" for n, t in (i.rsplit(":", 1) for i in images)
    )
    assert _run(registry, [compose, dockerfile], "--check").returncode == 0

    # The registry moves a tag: --check names it and changes nothing; a refresh takes the new digest.
    registry.digests[("grafana/grafana", images[2].rsplit(":", 1)[1])] = _digest("a new build")
    pinned_text = compose.read_text()
    stale = _run(registry, [compose, dockerfile], "--check")
    assert stale.returncode == 1 and "grafana/grafana" in stale.stdout and "stale" in stale.stdout, (
        stale.stdout
    )
    assert compose.read_text() == pinned_text
    assert _run(registry, [compose, dockerfile]).returncode == 0
    assert _digest("a new build") in compose.read_text()
