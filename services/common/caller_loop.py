"""What every Python caller of preset `caller` shares, the lab's and the floor's alike: what measuring
needs and nothing else (docs/caller.md).

A caller is one process in a cgroup of its own. It reads its settings from the environment, loads the
record pool as neutral records, verifies its call once against the pool (verify), then keeps
`concurrency` calls in flight (measure): a warm-up, then the measured window, at whose two ends it
reads its own cgroup's CPU time and the number of calls completed. It prints one JSON line per step
to stdout (the EVENT_* names), which the runner (labrunner.run.callers) reads: at the window's ends it
samples the server's CPU.

Per call this module runs only the loop and its counter. Whatever a caller does per call beyond
the call itself is its harness: the lab's callers against the floor's is its cost.
"""

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import uvloop

from services.common.cgroup import CgroupPaths, own_cgroup, read_stats
from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.records import Car, Driver, Record, checksum, load_pool

DOWNLOAD, UPLOAD = "download", "upload"
# The lines a caller prints, in order; a caller that cannot go on prints EVENT_FAILED and exits 1.
EVENT_READY = "ready"  # verified, about to warm up
EVENT_WINDOW_START = "window-start"
EVENT_WINDOW_END = "window-end"
EVENT_MEASURED = "measured"  # the window's figures, once the calls in flight have returned
EVENT_FAILED = "failed"
# The record pool's defaults, the servers' (services/common/config.py): the runner sets neither variable
# for a caller nor for its server, so both hold this pool.


class Mismatch(Exception):
    """A caller's call did not do the pool's work: other records decoded, or a reply that does not
    match what was sent."""


@dataclass(frozen=True)
class CallerSettings:
    """What the runner tells a caller, by environment variable (settings_from_env)."""

    address: str  # host:port of the server
    ca_file: str | None  # TLS when set: the CA that signed the server's certificate
    direction: str  # DOWNLOAD or UPLOAD
    count: int  # records per call
    concurrency: int  # calls in flight
    warmup_s: float
    duration_s: float
    pool_size: int
    seed: int

    @property
    def tls(self) -> bool:
        return self.ca_file is not None


def settings_from_env(environ: Mapping[str, str] = os.environ) -> CallerSettings:
    """CALLER_ADDRESS, CALLER_CA_FILE (unset: cleartext), CALLER_DIRECTION, CALLER_COUNT,
    CALLER_CONCURRENCY, CALLER_WARMUP_SECONDS, CALLER_DURATION_SECONDS, and the servers' RECORD_POOL_SIZE
    and RECORD_SEED (so both sides hold the same pool)."""
    direction = environ.get("CALLER_DIRECTION", DOWNLOAD)
    if direction not in (DOWNLOAD, UPLOAD):
        raise ValueError(f"CALLER_DIRECTION={direction!r} must be {DOWNLOAD!r} or {UPLOAD!r}")
    return CallerSettings(
        address=environ["CALLER_ADDRESS"],
        ca_file=environ.get("CALLER_CA_FILE") or None,
        direction=direction,
        count=int(environ.get("CALLER_COUNT", "100")),
        concurrency=int(environ.get("CALLER_CONCURRENCY", "10")),
        warmup_s=float(environ.get("CALLER_WARMUP_SECONDS", "2")),
        duration_s=float(environ.get("CALLER_DURATION_SECONDS", "8")),
        pool_size=int(environ.get("RECORD_POOL_SIZE", DEFAULT_POOL_SIZE)),
        seed=int(environ.get("RECORD_SEED", DEFAULT_SEED)),
    )


def pool_records(settings: CallerSettings) -> list[Record]:
    """The pool as the neutral records the servers hold (services.common.records.record_from_json's
    work, written out here so that a floor caller takes no lab function)."""
    return [
        Record(
            Car(**r["car"]),
            Driver(r["driver"]["firstname"], r["driver"]["lastname"], r["driver"]["driverId"]),
        )
        for r in load_pool(settings.pool_size, settings.seed)
    ]


class Batches:
    """An upload's records: each call takes the pool's next `count` records, rotating through the pool as
    a server does through its responses (the records differ from call to call; none is encoded twice)."""

    def __init__(self, pool: Sequence[Record], count: int) -> None:
        self._window = [*pool, *[pool[i % len(pool)] for i in range(count)]]
        self._size = len(pool)
        self._count = count
        self._start = 0

    def next(self) -> list[Record]:
        start = self._start
        self._start = (start + self._count) % self._size
        return self._window[start : start + self._count]


def verify_download(decoded: Sequence[Record], pool: Sequence[Record], count: int) -> int:
    """The checksum of the records a download of `count` records at offset 0 decoded; Mismatch unless
    they are the pool's first `count`, field for field."""
    if list(decoded) != list(pool[:count]):
        first = next((i for i, (a, b) in enumerate(zip(decoded, pool, strict=False)) if a != b), None)
        where = f"record {first} differs" if first is not None else f"{len(decoded)} records decoded"
        raise Mismatch(f"the download decoded other records than the pool's first {count}: {where}")
    return checksum(decoded)


def verify_upload(reply_count: int, reply_checksum: int, sent: Sequence[Record]) -> int:
    """The checksum the server answered for an upload of `sent`; Mismatch unless it and the count are
    those of the records sent."""
    expected = checksum(sent)
    if (reply_count, reply_checksum) != (len(sent), expected):
        raise Mismatch(
            f"the server answered count {reply_count}, checksum {reply_checksum}; "
            f"sent {len(sent)} records, checksum {expected}"
        )
    return reply_checksum


@dataclass(frozen=True)
class Sample:
    """The caller at one end of its window: calls completed, its cgroup's CPU, the wall clock."""

    at: float  # time.monotonic()
    calls: int
    cpu_seconds: float | None
    user_seconds: float | None
    system_seconds: float | None
    periods: int | None  # CFS periods, and those in which the quota ran out
    throttled_periods: int | None
    cpu_limit_cores: float | None  # the cgroup's quota


@dataclass(frozen=True)
class Window:
    start: Sample
    end: Sample

    def figures(self) -> dict[str, float | int | None]:
        """The window's calls, seconds and CPU (total, user, system), its CFS periods and the quota."""

        def delta(name: str) -> float | int | None:
            before, after = getattr(self.start, name), getattr(self.end, name)
            return None if before is None or after is None else after - before

        return {
            "calls": self.end.calls - self.start.calls,
            "seconds": self.end.at - self.start.at,
            "cpu_seconds": delta("cpu_seconds"),
            "user_seconds": delta("user_seconds"),
            "system_seconds": delta("system_seconds"),
            "periods": delta("periods"),
            "throttled_periods": delta("throttled_periods"),
            "cpu_limit_cores": self.end.cpu_limit_cores,
        }


def say(event: str, **fields: object) -> None:
    """One JSON line to the runner."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def verify(
    settings: CallerSettings,
    pool: Sequence[Record],
    download: Callable[[int], Awaitable[Sequence[Record]]],
    upload: Callable[[Sequence[Record]], Awaitable[tuple[int, int]]],
) -> None:
    """Verify a caller's call once, then print EVENT_READY with what was found: download(offset) must
    decode the pool's first `count` records at offset 0; upload(records), answering the reply's (count,
    checksum), must be answered for the pool's first `count` records with their checksum."""
    if settings.direction == DOWNLOAD:
        verified = verify_download(await download(0), pool, settings.count)
    else:
        sent = pool[: settings.count]
        verified = verify_upload(*await upload(sent), sent)
    say(EVENT_READY, direction=settings.direction, count=settings.count, checksum=verified)


def measured(window: Window, **extra: object) -> None:
    """EVENT_MEASURED: the window's figures, and what a caller adds (the lab's latency and errors)."""
    say(EVENT_MEASURED, **window.figures(), **extra)


async def measure(settings: CallerSettings, call: Callable[[], Awaitable[object]]) -> Window:
    """`concurrency` calls in flight, each started when the last one returned, for the warm-up and then
    the measured window; the calls in flight at its end are awaited, none started after. A call that
    raises ends the caller (the task group cancels the rest)."""
    cgroup = own_cgroup()
    calls = 0
    running = True

    async def keep_calling() -> None:
        nonlocal calls
        while running:
            await call()
            calls += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(settings.concurrency):
            group.create_task(keep_calling())
        await asyncio.sleep(settings.warmup_s)
        start = _sample(cgroup, calls)
        say(EVENT_WINDOW_START)
        await asyncio.sleep(settings.duration_s)
        end = _sample(cgroup, calls)
        say(EVENT_WINDOW_END)
        running = False
    return Window(start, end)


def _sample(cgroup: CgroupPaths, calls: int) -> Sample:
    stats = read_stats(cgroup)
    return Sample(
        at=time.monotonic(),
        calls=calls,
        cpu_seconds=stats.cpu_usage_seconds,
        user_seconds=stats.cpu_user_seconds,
        system_seconds=stats.cpu_system_seconds,
        periods=stats.cpu_periods,
        throttled_periods=stats.cpu_throttled_periods,
        cpu_limit_cores=stats.cpu_limit_cores,
    )


def run(main: Callable[[CallerSettings], Coroutine[Any, Any, None]]) -> None:
    """Run a caller's main on a uvloop event loop, as the lab's servers run (every caller the same loop);
    a Mismatch or an error prints EVENT_FAILED with why and exits 1."""
    settings = settings_from_env()
    try:
        uvloop.run(main(settings))
    except Exception as error:  # the runner reads why from the line
        while isinstance(error, ExceptionGroup):  # a call that raised inside measure's task group
            error = error.exceptions[0]
        say(EVENT_FAILED, error=f"{type(error).__name__}: {error}", settings=asdict(settings))
        sys.exit(1)
