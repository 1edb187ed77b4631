"""Pin the lab's images by digest: each default image of docker-compose.yml (`${X_IMAGE:-ref}`) and
services/Dockerfile's `ARG PYTHON_IMAGE=ref` becomes `name:tag@sha256:...`, the digest the registry
gives for name:tag now (its multi-platform index, so every architecture keeps working).

    scripts/pin_images.py            # refresh the digests in place (needs the registry)
    scripts/pin_images.py --check    # exit 1 naming each image whose digest is missing or stale

The tag stays beside the digest for the reader; Docker pulls by the digest. The variables
(PROMETHEUS_IMAGE, ...) still override an image as they did (CI's substitutes, tests/docker/).
"""

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "services" / "Dockerfile"
DOCKER_HUB = "https://registry-1.docker.io"
DOCKER_HUB_AUTH = "https://auth.docker.io/token?service=registry.docker.io"
# What a multi-platform image's digest names (OCI index or Docker manifest list), then single ones.
ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_REF = r"(?P<ref>[a-z0-9][\w./-]*:[\w.-]+(?:@sha256:[0-9a-f]{64})?)"
PATTERNS = {
    COMPOSE_FILE: re.compile(r"\$\{[A-Z0-9_]+_IMAGE:-" + _REF + r"\}"),
    DOCKERFILE: re.compile(r"^ARG PYTHON_IMAGE=" + _REF + r"$", re.MULTILINE),
}


@dataclass(frozen=True)
class Ref:
    """name:tag[@sha256:digest], as written."""

    name: str
    tag: str
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> "Ref":
        named, _, digest = text.partition("@")
        name, _, tag = named.rpartition(":")
        return cls(name, tag, digest or None)

    def __str__(self) -> str:
        return f"{self.name}:{self.tag}" + (f"@{self.digest}" if self.digest else "")

    @property
    def repository(self) -> str:
        """Docker Hub's repository path: official images live under library/."""
        return self.name if "/" in self.name else f"library/{self.name}"


class Registry:
    """Docker Hub's registry API (distribution spec): a pull token, then a manifest HEAD."""

    def __init__(self, url: str = DOCKER_HUB, auth: str = DOCKER_HUB_AUTH, timeout: float = 30) -> None:
        self.url, self.auth, self.timeout = url.rstrip("/"), auth, timeout

    def digest(self, ref: Ref) -> str:
        """The digest the registry gives name:tag now."""
        scope = urllib.parse.urlencode({"scope": f"repository:{ref.repository}:pull"})
        with urllib.request.urlopen(f"{self.auth}&{scope}", timeout=self.timeout) as response:
            token = json.load(response)["token"]
        request = urllib.request.Request(
            f"{self.url}/v2/{ref.repository}/manifests/{ref.tag}",
            method="HEAD",
            headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            digest = response.headers.get("Docker-Content-Digest", "")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise SystemExit(f"{ref.name}:{ref.tag}: the registry gave no digest ({digest!r})")
        return digest


def refs(path: Path) -> list[Ref]:
    """Every pinnable image reference in path, in order."""
    return [Ref.parse(match["ref"]) for match in PATTERNS[path].finditer(path.read_text())]


def pin(path: Path, registry: Registry, check: bool) -> list[str]:
    """Each reference of path at its current digest; with check, only the problems (nothing written)."""
    text = path.read_text()
    problems = []

    def replace(match: re.Match[str]) -> str:
        ref = Ref.parse(match["ref"])
        current = Ref(ref.name, ref.tag, registry.digest(ref))
        if current != ref:
            problems.append(f"{path.name}: {ref} is {'stale' if ref.digest else 'not pinned'}: {current}")
        start, end = match.span("ref")
        whole = match.group(0)
        return whole[: start - match.start()] + str(current) + whole[end - match.start() :]

    pinned = PATTERNS[path].sub(replace, text)
    if not check and pinned != text:
        path.write_text(pinned)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when a digest is missing or stale"
    )
    parser.add_argument("--registry", default=DOCKER_HUB, help=f"the registry's API (default {DOCKER_HUB})")
    parser.add_argument("--auth", default=DOCKER_HUB_AUTH, help="its token endpoint")
    parser.add_argument(
        "files", nargs="*", type=Path, help="default: docker-compose.yml and services/Dockerfile"
    )
    args = parser.parse_args(argv)
    registry = Registry(args.registry, args.auth)
    files = args.files or [COMPOSE_FILE, DOCKERFILE]
    problems = []
    for path in files:
        kind = DOCKERFILE if path.name == DOCKERFILE.name else COMPOSE_FILE
        PATTERNS.setdefault(path, PATTERNS[kind])
        if not refs(path):
            raise SystemExit(f"{path}: no image reference found")
        problems += pin(path, registry, args.check)
    for problem in problems:
        print(problem)
    if args.check:
        return 1 if problems else 0
    print(
        f"pinned {sum(len(refs(path)) for path in files)} images by digest"
        + (f", {len(problems)} changed" if problems else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
