"""What every lab caller runs its calls through: one client interface per library (Client), and the
harness around each call: its latency, a failure counted instead of fatal, a reply's size checked
(each client gives its calls a deadline, CALL_TIMEOUT_S, through its library). The floor callers
(benchmarks/callers/) make the same calls without it, so a lab caller against its floor is what this
module and the client classes cost the caller.
"""

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.common.caller_loop import (
    DOWNLOAD,
    Batches,
    CallerSettings,
    Window,
    measure,
    measured,
    pool_records,
    verify,
)
from services.common.records import Record

# Longer than any call of a healthy server takes, even of 1,000 records at a quarter CPU.
CALL_TIMEOUT_S = 10.0
LATENCY_PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True)
class Reply:
    """What an upload's reply says of the records the server received."""

    count: int
    checksum: int


class Client(Protocol):
    """One client library's calls, each decoding its reply into neutral records (download) or building its
    request from them (upload)."""

    async def download(self, count: int, offset: int | None = None) -> list[Record]: ...

    async def upload(self, records: Sequence[Record]) -> Reply: ...

    async def close(self) -> None: ...


class WrongSize(Exception):
    """A reply of another number of records than the call asked for or sent."""


class Harness:
    """Calls through the lab's harness, their latencies and failures in the order they returned (the
    n-th returned is the loop's n-th counted call, so a window's calls are a slice of them)."""

    def __init__(self, client: Client, settings: CallerSettings, pool: Sequence[Record]) -> None:
        self._client = client
        self._count = settings.count
        self._batches = Batches(pool, settings.count)
        self.latencies: list[float] = []
        self.failed: list[bool] = []
        self.first_error: str | None = None

    def call(self, direction: str) -> Callable[[], Awaitable[None]]:
        return self._download if direction == DOWNLOAD else self._upload

    async def _download(self) -> None:
        await self._timed(self._downloaded())

    async def _upload(self) -> None:
        await self._timed(self._uploaded())

    async def _downloaded(self) -> None:
        records = await self._client.download(self._count)
        if len(records) != self._count:
            raise WrongSize(f"{len(records)} records decoded, {self._count} asked for")

    async def _uploaded(self) -> None:
        reply = await self._client.upload(self._batches.next())
        if reply.count != self._count:
            raise WrongSize(f"the server received {reply.count} records, {self._count} sent")

    async def _timed(self, call: Awaitable[None]) -> None:
        started = time.perf_counter()
        failed = False
        try:
            await call
        except Exception as error:  # counted and described: the loop goes on
            failed = True
            self.first_error = self.first_error or f"{type(error).__name__}: {error}"
        self.latencies.append(time.perf_counter() - started)
        self.failed.append(failed)

    def figures(self, window: Window) -> dict[str, object]:
        """The window's failed calls, the first error seen, and the latency percentiles in ms."""
        latencies = self.latencies[window.start.calls : window.end.calls]
        failed = sum(self.failed[window.start.calls : window.end.calls])
        latency_ms: dict[str, float] = {}
        if len(latencies) >= 2:
            cuts = statistics.quantiles(latencies, n=100, method="inclusive")
            latency_ms = {name: cuts[p - 1] * 1000 for name, p in LATENCY_PERCENTILES.items()}
            latency_ms["max"] = max(latencies) * 1000
        return {"errors": failed, "first_error": self.first_error, "latency_ms": latency_ms}


async def serve_calls(settings: CallerSettings, connect: Callable[[CallerSettings], Client]) -> None:
    """A lab caller's whole life: verify its call against the pool, then measure it (services.common.
    caller_loop's events), then close its client."""
    pool = pool_records(settings)
    client = connect(settings)

    async def download(offset: int) -> list[Record]:
        return await client.download(settings.count, offset)

    async def upload(records: Sequence[Record]) -> tuple[int, int]:
        reply = await client.upload(records)
        return reply.count, reply.checksum

    try:
        await verify(settings, pool, download, upload)
        harness = Harness(client, settings, pool)
        window = await measure(settings, harness.call(settings.direction))
        measured(window, **harness.figures(window))
    finally:
        await client.close()
