"""The Python driver's load: what it reads from the environment k6's scripts read (run/k6/invocation.py),
and the two load models it runs, closed (constant-vus: each VU sends its next request when its reply is
in) and open (constant-arrival-rate: requests start at the rate, each on an idle VU, or are dropped).

A VU is one connection, opened before the clock starts, as k6's VUs are by their first request. The
clock of a request runs from just before it is sent to its whole reply in, on time.perf_counter.
"""

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import orjson

from labrunner.model.scenario import DRIVER_LOAD_MODELS
from labrunner.model.schema import duration_seconds
from labrunner.run.drive.clients import Connection, Opener, Reply

# What the driver reads of rest.js's environment (docs/CONTRACTS.md) and refuses: the parts of k6's
# contract it does not run.
UNSUPPORTED_ENV = {
    "CHURN": "new connections (churn)",
    "COMPRESSION": "compression",
    "UPLOAD_FILE": "uploads",
    "STREAMS": "several requests at once on a connection (streams)",
    "STAGES": "ramping load models",
}
CHECK_EVERY = 50  # decode and check a VU's first reply, then 1 in CHECK_EVERY (k6/lib/common.js)


class DriveError(ValueError):
    """The driver cannot run what it was asked: the message says what and why."""


@dataclass(frozen=True)
class Plan:
    """One run of the driver: where to send, how much, for how long."""

    base_url: str
    protocol: str  # EXPECT_PROTO
    count: int
    executor: str  # LOAD_MODELS
    duration_s: float
    vus: int  # connections: a closed model's VUs, an open model's pool
    rate: float | None  # an open model's requests per second
    ca_file: str | None

    @property
    def path(self) -> str:
        return f"/records?count={self.count}"


def plan_from(
    env: Mapping[str, str], segment: tuple[Fraction, Fraction] = (Fraction(0), Fraction(1))
) -> Plan:
    """The run the environment asks for; an execution segment's part of its VUs and rate (k6's
    --execution-segment "1/2:1": the VUs numbered in it, the rate times its length).

    DriveError when it asks for what the driver does not run, or lacks what it needs."""
    for name, what in UNSUPPORTED_ENV.items():
        if env.get(name):
            raise DriveError(f"{name} is set: the Python driver does not run {what}")
    executor = env.get("LOAD_MODEL", "constant-vus")
    if executor not in DRIVER_LOAD_MODELS:
        raise DriveError(f"LOAD_MODEL={executor}: the Python driver runs {' and '.join(DRIVER_LOAD_MODELS)}")
    base_url = env.get("BASE_URL", "").rstrip("/")
    if not base_url:
        raise DriveError("BASE_URL is not set")
    try:
        duration_s = duration_seconds(env.get("DURATION", "30s"))
        count = int(env.get("COUNT", "100"))
        if executor == "constant-vus":
            vus, rate = int(env.get("VUS", "1")), None
        else:
            rate = float(env["RATE"]) * float(segment[1] - segment[0])
            vus = max(int(env.get("PRE_ALLOCATED_VUS", "1")), int(env.get("MAX_VUS", "0") or 0))
    except (KeyError, ValueError) as exc:
        raise DriveError(f"bad load settings: {exc}") from None
    return Plan(
        base_url=base_url,
        protocol=env.get("EXPECT_PROTO", "HTTP/1.1"),
        count=count,
        executor=executor,
        duration_s=duration_s,
        vus=max(1, math.floor(vus * segment[1]) - math.floor(vus * segment[0])),
        rate=rate,
        ca_file=env.get("SSL_CERT_FILE") or None,
    )


@dataclass
class Tally:
    """What the requests of a run did, as they finished."""

    latency_ms: list[float] = field(default_factory=list)  # successful requests', in the order they ended
    failed: int = 0
    received_bytes: int = 0
    checks_passed: int = 0
    checks_failed: int = 0
    iterations: int = 0
    dropped: int = 0
    first_failure: str | None = None

    def fail(self, why: str) -> None:
        self.failed += 1
        self.first_failure = self.first_failure or why


def check_reply(reply: Reply, plan: Plan, decode: bool, tally: Tally) -> bool:
    """Whether a reply succeeded (status 200 on the expected protocol); a decoded one's checks counted."""
    ok = reply.status == 200 and reply.protocol == plan.protocol
    if not decode:
        return ok
    try:
        records = orjson.loads(reply.body).get("records")
    except (orjson.JSONDecodeError, AttributeError):
        records = None
    for passed in (ok, isinstance(records, list) and len(records) == plan.count):
        if passed:
            tally.checks_passed += 1
        else:
            tally.checks_failed += 1
    return ok and isinstance(records, list) and len(records) == plan.count


async def _one(connection: Connection, plan: Plan, decode: bool, tally: Tally) -> None:
    """One request on a connection: timed, checked, tallied."""
    tally.iterations += 1
    began = time.perf_counter()
    try:
        reply = await connection.get(plan.path)
    except Exception as exc:
        tally.fail(f"GET {plan.path}: {type(exc).__name__}: {exc}")
        return
    elapsed_ms = (time.perf_counter() - began) * 1000
    tally.received_bytes += len(reply.body) + reply.header_bytes
    if check_reply(reply, plan, decode, tally):
        tally.latency_ms.append(elapsed_ms)
    else:
        tally.fail(f"GET {plan.path}: status {reply.status} over {reply.protocol}")


async def run(plan: Plan, open_connection: Opener) -> tuple[Tally, float]:
    """Open the VUs' connections, run the load model for its duration; the tally and the seconds it ran."""
    connections = await asyncio.gather(*(open_connection() for _ in range(plan.vus)))
    tally = Tally()
    began = time.perf_counter()
    deadline = began + plan.duration_s
    try:
        if plan.rate is None:
            await asyncio.gather(*(_closed_vu(c, plan, deadline, tally) for c in connections))
        else:
            await _open_model(connections, plan, plan.rate, deadline, tally)
    finally:
        ran_s = time.perf_counter() - began
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
    return tally, ran_s


async def _closed_vu(connection: Connection, plan: Plan, deadline: float, tally: Tally) -> None:
    iteration = 0
    while time.perf_counter() < deadline:
        await _one(connection, plan, iteration % CHECK_EVERY == 0, tally)
        iteration += 1


async def _open_model(
    connections: list[Connection], plan: Plan, rate: float, deadline: float, tally: Tally
) -> None:
    """Start a request every 1/rate s on an idle connection; with none idle, the start is dropped (k6's
    dropped_iterations). Requests in flight at the deadline finish, as k6's graceful stop lets them."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for connection in connections:
        idle.put_nowait(connection)
    started = 0
    in_flight: set[asyncio.Task[None]] = set()
    first = time.perf_counter()

    async def on(connection: Connection, decode: bool) -> None:
        try:
            await _one(connection, plan, decode, tally)
        finally:
            idle.put_nowait(connection)

    while (due := first + started / rate) < deadline:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        started += 1
        if idle.empty():
            tally.dropped += 1
            continue
        task = asyncio.create_task(on(idle.get_nowait(), started % CHECK_EVERY == 1))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
