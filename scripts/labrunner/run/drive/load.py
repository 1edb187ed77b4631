"""The Python driver's load: what it reads from the environment k6's scripts read (run/k6/invocation.py),
and the two load models it runs, closed (constant-vus: each VU sends its next request when its reply is
in; under CHURN on a new connection every N requests) and open (constant-arrival-rate: requests start
at the rate, each on an idle VU, one opened up to MAX_VUS, or are dropped).

A VU is one connection, opened before the clock starts, as k6's VUs are by their first request. The
clock of a request runs from just before it is sent to its whole reply in, on time.perf_counter.
"""

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import orjson

from labrunner.model.terms import DRIVER_LOAD_MODELS, duration_seconds
from labrunner.run.drive.connection import Connection, Opener, Reply

# What the driver reads of rest.js's environment (docs/CONTRACTS.md) and refuses: the parts of k6's
# contract it does not run.
UNSUPPORTED_ENV = {
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
    executor: str  # DRIVER_LOAD_MODELS
    duration_s: float
    vus: int  # connections opened before the clock: a closed model's VUs, an open model's pre-allocated
    rate: float | None  # an open model's requests per second
    max_vus: int  # an open model's connections at most (opened when none is idle), a closed model's VUs
    churn: int | None  # a closed model's VU replaces its connection every `churn` requests (CHURN)
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
    churn = env.get("CHURN") or None
    if churn is not None and executor != "constant-vus":
        raise DriveError(
            f"CHURN={churn} under {executor}: the Python driver churns a closed model's VUs only"
        )
    base_url = env.get("BASE_URL", "").rstrip("/")
    if not base_url:
        raise DriveError("BASE_URL is not set")
    try:
        duration_s = duration_seconds(env.get("DURATION", "30s"))
        count = int(env.get("COUNT", "100"))
        churn_every = None if churn is None else int(churn)
        if executor == "constant-vus":
            vus, rate = int(env.get("VUS", "1")), None
            most = vus
        else:
            rate = float(env["RATE"]) * float(segment[1] - segment[0])
            vus = int(env.get("PRE_ALLOCATED_VUS", "1"))
            most = max(vus, int(env.get("MAX_VUS", "0") or 0))
    except (KeyError, ValueError) as exc:
        raise DriveError(f"bad load settings: {exc}") from None
    return Plan(
        base_url=base_url,
        protocol=env.get("EXPECT_PROTO", "HTTP/1.1"),
        count=count,
        executor=executor,
        duration_s=duration_s,
        vus=_share(vus, segment),
        rate=rate,
        max_vus=_share(most, segment),
        churn=churn_every,
        ca_file=env.get("SSL_CERT_FILE") or None,
    )


def _share(vus: int, segment: tuple[Fraction, Fraction]) -> int:
    """The VUs numbered in an execution segment (at least one): the segments of a run add up to vus."""
    return max(1, math.floor(vus * segment[1]) - math.floor(vus * segment[0]))


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
    connections: int = 0  # opened: the VUs' before the clock, a churning VU's new ones, an open model's added
    vus: int = 0  # the most connections held at once
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
    connections = list(await asyncio.gather(*(open_connection() for _ in range(plan.vus))))
    tally = Tally(connections=len(connections))
    closing: set[asyncio.Task[None]] = set()  # churned connections still closing
    began = time.perf_counter()
    deadline = began + plan.duration_s
    try:
        if plan.rate is None:
            vus = range(len(connections))
            await asyncio.gather(
                *(
                    _closed_vu(
                        connections,
                        i,
                        open_connection,
                        plan=plan,
                        deadline=deadline,
                        tally=tally,
                        closing=closing,
                    )
                    for i in vus
                )
            )
        else:
            await _open_model(
                connections, open_connection, plan, rate=plan.rate, deadline=deadline, tally=tally
            )
    finally:
        ran_s = time.perf_counter() - began
        tally.vus = len(connections)
        await asyncio.gather(*closing, *(c.close() for c in connections), return_exceptions=True)
    return tally, ran_s


async def _close_quietly(connection: Connection) -> None:
    """A churned connection's close, whatever it meets (a server that already ended it)."""
    with contextlib.suppress(Exception):
        await connection.close()


async def _closed_vu(
    connections: list[Connection],
    vu: int,
    open_connection: Opener,
    *,
    plan: Plan,
    deadline: float,
    tally: Tally,
    closing: set[asyncio.Task[None]],
) -> None:
    """VU `vu`'s requests on connections[vu], one after another; under churn its connection is closed
    and a new one opened every plan.churn requests, outside the request's clock (k6's http_req_duration
    leaves connecting out too), inside the VU's time (so req/s pays for it).

    The old connection closes beside the new one's opening, in a task of `closing`, as a TCP socket's
    close returns at once: closing a QUIC connection lasts its closing period (three probe timeouts,
    RFC 9000 section 10.2), 100-200 ms here, which the VU spent idle while the server waited for work
    when it waited for the close (HTTP/3 under churn, at 72-94% of its quota instead of 100%)."""
    iteration = 0
    while time.perf_counter() < deadline:
        if plan.churn and iteration and iteration % plan.churn == 0:
            closing.add(task := asyncio.create_task(_close_quietly(connections[vu])))
            task.add_done_callback(closing.discard)
            try:
                connections[vu] = await open_connection()
            except (OSError, TimeoutError) as exc:
                tally.fail(f"connect: {type(exc).__name__}: {exc}")
                return
            tally.connections += 1
        await _one(connections[vu], plan, iteration % CHECK_EVERY == 0, tally)
        iteration += 1


async def _open_model(
    connections: list[Connection],
    open_connection: Opener,
    plan: Plan,
    *,
    rate: float,
    deadline: float,
    tally: Tally,
) -> None:
    """Start a request every 1/rate s on the connection idle the shortest time, as a pool of k6's VUs:
    with none idle, a new one is opened while there are fewer than max_vus (a VU k6 initializes mid-run),
    else the start is dropped (k6's dropped_iterations). Requests in flight at the deadline finish, as
    k6's graceful stop lets them. Opened connections join `connections`, which the caller closes."""
    idle = list(connections)  # a stack: the most recently idle on top
    opening = 0  # connections being opened
    started = 0
    in_flight: set[asyncio.Task[None]] = set()
    first = time.perf_counter()

    async def on(connection: Connection | None, decode: bool) -> None:
        nonlocal opening
        if connection is None:  # opened in its iteration, as k6 initializes a VU
            try:
                connection = await open_connection()
                connections.append(connection)
                tally.connections += 1
            except (OSError, TimeoutError) as exc:
                tally.iterations += 1
                tally.fail(f"connect: {type(exc).__name__}: {exc}")
                return
            finally:
                opening -= 1
        try:
            await _one(connection, plan, decode, tally)
        finally:
            idle.append(connection)

    while (due := first + started / rate) < deadline:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        started += 1
        if idle:
            connection: Connection | None = idle.pop()
        elif len(connections) + opening < plan.max_vus:
            opening += 1
            connection = None
        else:
            tally.dropped += 1
            continue
        task = asyncio.create_task(on(connection, started % CHECK_EVERY == 1))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
