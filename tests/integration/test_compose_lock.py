"""services/Dockerfile installs the services' runtime from requirements.lock with pip's
--require-hashes: the lock pins what requirements.txt pins, and its hashes are what pip checks
(a real pip, offline, against wheels in a folder)."""

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.integration.compose_support import dockerfile_stages
from tests.support import ROOT


def _lock_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lock_requirements", ROOT / "scripts" / "lock_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCK = _lock_script()


def test_the_image_installs_only_hashed_wheels_of_the_lock() -> None:
    installs = [
        rest
        for stage in dockerfile_stages(ROOT / "services" / "Dockerfile")
        for keyword, rest in stage.instructions
        if keyword == "RUN" and "pip install" in rest
    ]
    assert installs == [
        "pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all: -r requirements.lock"
    ]


def test_the_lock_pins_exactly_what_requirements_txt_pins_each_with_a_hash() -> None:
    lock = LOCK.read_lock(ROOT / "requirements.lock")
    assert {name: version for name, version in lock} == LOCK.pins(ROOT / "requirements.txt")
    assert all(lock.values()), [key for key, hashes in lock.items() if not hashes]
    # What the script writes from requirements.txt and the lock's own hashes is the lock as committed.
    assert LOCK.render(ROOT / "requirements.txt", lock) == (ROOT / "requirements.lock").read_text()


def test_the_lock_holds_the_x86_64_and_the_aarch64_wheel_of_each_compiled_pin() -> None:
    """The image builds on either architecture: each compiled pin carries two wheels' hashes,
    this host's and those `--arch aarch64` adds, which are for the image's glibc or older."""
    tags = LOCK.platform_tags("aarch64")
    assert tags[0] == "manylinux_2_36_aarch64" and tags[-2:] == [
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ]
    lock = LOCK.read_lock(ROOT / "requirements.lock")
    pins = LOCK.pins(ROOT / "requirements.txt")
    compiled = ("aiohttp", "cryptography", "granian", "grpcio", "orjson", "protobuf", "pylsqpack", "uvloop")
    assert {pin: len(lock[(pin, pins[pin])]) for pin in compiled} == dict.fromkeys(compiled, 2)


def _pip_install(lock: Path, wheels: Path, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(wheels),
            "--require-hashes", "--no-deps", "--only-binary=:all:", "--target", str(target), "-r", str(lock),
        ],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_pip_refuses_a_wheel_whose_hash_is_not_in_the_lock(tmp_path: Path) -> None:
    """A lock the script writes from a wheel is installed by pip; the same name and version with other
    bytes is refused, as a tampered download would be."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # A real wheel of a pin (pure Python), as pip download leaves it, from the host's pip cache or PyPI.
    pin = "aiofiles"
    version = LOCK.pins(ROOT / "requirements.txt")[pin]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "-d", str(wheels), f"{pin}=={version}"],
        check=True, timeout=120,
    )  # fmt: skip
    [wheel] = wheels.glob("*.whl")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"{pin}=={version}\n")
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK.render(requirements, LOCK.wheel_hashes(wheels)))
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() in lock.read_text()
    installed = _pip_install(lock, wheels, tmp_path / "ok")
    assert installed.returncode == 0, installed.stderr
    # The same file name with one byte more: pip must refuse it.
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    shutil.copy(wheel, tampered / wheel.name)
    with (tampered / wheel.name).open("ab") as out:
        out.write(b"\0")
    refused = _pip_install(lock, tampered, tmp_path / "refused")
    assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr, (
        refused.stderr
    )
