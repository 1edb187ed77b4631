"""Tar archives through the engine's API: k6's files into a container on another engine, k6's
results and the certs volume's files out of one."""

import io
import shutil
import tarfile
from collections.abc import Collection
from pathlib import Path

from docker.errors import NotFound
from docker.models.containers import Container

from labrunner import certs
from labrunner.backends.base import K6Invocation
from labrunner.backends.docker.names import CERTS_DIR, K6_DIR, PROTO_DIR, RESULTS_DIR, shape_mount


def k6_files(root: Path, certs_dir: Path) -> bytes:
    """What k6 on another engine reads (k6/, proto/, the user's message's files, the lab CA) and a
    results directory it can write, as a tar for put_archive at the container's root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory, inside in ((root / "k6", K6_DIR), (root / "proto", PROTO_DIR), *shape_mount().items()):
            tar.add(directory, arcname=inside.lstrip("/"), filter=_readable)
        ca = certs_dir / certs.CA_FILE
        if ca.exists():
            tar.add(ca, arcname=f"{CERTS_DIR.lstrip('/')}/{certs.CA_FILE}", filter=_readable)
        results = tarfile.TarInfo(RESULTS_DIR.lstrip("/"))
        results.type, results.mode = tarfile.DIRTYPE, 0o1777  # k6's image runs as its own user
        tar.addfile(results)
    return buffer.getvalue()


def copy_results(container: Container, invocation: K6Invocation) -> None:
    """k6's summary and raw samples out of its container into the host paths the runner reads;
    a file k6 did not write stays missing (the runner then reports the missing summary)."""
    for path in (invocation.summary_file, invocation.raw_file):
        if path is None:
            continue
        try:
            stream, _ = container.get_archive(f"{RESULTS_DIR}/{path.name}")
        except NotFound:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        archive = path.with_name(path.name + ".tar")  # on disk: raw samples can be gigabytes
        try:
            with archive.open("wb") as file:
                for chunk in stream:
                    file.write(chunk)
            with tarfile.open(archive) as tar, path.open("wb") as out:
                member = tar.extractfile(path.name)
                if member is not None:
                    shutil.copyfileobj(member, out)
        finally:
            archive.unlink(missing_ok=True)


def read_files(container: Container, directory: str, names: Collection[str]) -> dict[str, bytes]:
    """The files of a container's directory that have one of these names, by name."""
    stream, _ = container.get_archive(directory)
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            data = tar.extractfile(member) if name in names else None
            if data is not None:
                files[name] = data.read()
    return files


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files for k6's container: readable by its user, no bytecode caches."""
    if "__pycache__" in info.name:
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info
