"""Reading a server's environment: the parsers, and the settings that decide what a request costs.

The lab's servers (services.common.config) and the floors (benchmarks.floor.common) both read
these here, with one set of defaults, so a floor cannot drift from the lab it is the floor of.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from services.common.pool import DEFAULT_SHAPE, SHAPES, USER_SHAPE


class ConfigError(ValueError):
    """An environment variable holds a value the service cannot use."""


def env_int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ConfigError(f"{name}={value} must be >= 0")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1 or 0)")


# The largest request body (REST) or message (gRPC) a server takes unless MAX_REQUEST_BYTES says otherwise.
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
# The record pool every server serves by default (RECORD_POOL_SIZE, RECORD_SEED); a client that must
# hold the servers' pool (the runner's verification and uploads, the callers) starts from the same.
DEFAULT_POOL_SIZE, DEFAULT_SEED = 10_000, 42


@dataclass(frozen=True)
class Workload:
    """Where a server listens and the settings that decide a request's work, with the lab's defaults."""

    host: str
    record_pool_size: int
    record_seed: int
    default_count: int
    max_count: int
    # The largest request body (REST, else 413) or upload (gRPC, else RESOURCE_EXHAUSTED).
    max_request_bytes: int
    # The record shape served, for the process's life (services.common.pool SHAPES; docs/CONTRACTS.md).
    shape: str
    # SHAPE=proto's files (the user's own message: services.common.user_message), else None.
    shape_dir: Path | None = None
    # GC_FREEZE: the start-up heap frozen out of the garbage collector's walks (services.common.heap).
    gc_freeze: bool = True


def read_shape() -> tuple[str, Path | None]:
    """SHAPE: one of the record shapes, cars when unset; or proto, the user's own message, whose files
    SHAPE_DIR holds."""
    shape = os.environ.get("SHAPE", "").strip() or DEFAULT_SHAPE
    if shape == USER_SHAPE:
        directory = os.environ.get("SHAPE_DIR", "").strip()
        if not directory or not Path(directory).is_dir():
            raise ConfigError(
                f"SHAPE={USER_SHAPE} needs SHAPE_DIR, the directory the runner wrote its files in"
            )
        return shape, Path(directory)
    if shape not in SHAPES:
        raise ConfigError(f"SHAPE={shape!r} must be one of {', '.join((*SHAPES, USER_SHAPE))}")
    return shape, None


def read_workload() -> Workload:
    """HOST, RECORD_POOL_SIZE, RECORD_SEED, DEFAULT_COUNT, MAX_COUNT, MAX_REQUEST_BYTES, SHAPE, GC_FREEZE."""
    max_count = env_int("MAX_COUNT", 1000, minimum=1)
    default_count = env_int("DEFAULT_COUNT", 100, minimum=1)
    if default_count > max_count:
        raise ConfigError(f"DEFAULT_COUNT={default_count} exceeds MAX_COUNT={max_count}")
    shape, shape_dir = read_shape()
    return Workload(
        host=os.environ.get("HOST", "").strip() or "127.0.0.1",
        record_pool_size=env_int("RECORD_POOL_SIZE", DEFAULT_POOL_SIZE, minimum=1),
        record_seed=env_int("RECORD_SEED", DEFAULT_SEED),
        default_count=default_count,
        max_count=max_count,
        max_request_bytes=env_int("MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES, minimum=1),
        shape=shape,
        shape_dir=shape_dir,
        gc_freeze=env_bool("GC_FREEZE", True),
    )
