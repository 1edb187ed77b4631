"""What a TLS connection costs the servers whose TLS is Python's ssl module, full handshake against
resumed: the server worker's CPU per connection, measured with a Python client that resumes.

k6 never offers a session (Go's crypto/tls without a ClientSessionCache), so the lab's churn runs
measure full handshakes only. Here each counting server (aiohttp, Quart on Hypercorn, grpclib: the
servers whose handshakes protolab_tls_handshakes_total counts) is started for real, with TLS, one
worker (a worker seals its tickets with its own keys, so with one every offered session resumes) and
its metrics, pinned to one CPU and the client to another. In each round, the phases' order reversed
every other round, the client makes K connections of each kind:

- full: connect, a full handshake (no session offered), a clean TLS close (close_notify both ways),
  close;
- resumed: the same, offering the session of the connection before (chained: TLS 1.3 tickets reach a
  client after the handshake, so a connection's session is read after its close, which reads them);
- no handshake: connect and close before any ClientHello: the accept, the TLS transport's setup and
  teardown, no handshake, no application protocol (that starts only once a handshake completes). The
  floor under a TLS connection on the same server and port, not a cleartext connection (a TLS port
  takes none).

The server's CPU per phase is its worker's threads' run time (/proc/<pid>/task/*/schedstat, in ns)
from before the phase's first connection until the server has closed its last one (no socket of
its port left established or half-closed). A figure is per connection: the handshake plus what the
server does for any TLS connection (accept, the transport, its application protocol's start and
end, the close). After each handshake phase the server's own counter must equal the plan, and the
client must have seen every resumed connection resume and no full one: else HandshakeMismatch.
"""

import contextlib
import functools
import os
import platform
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from labrunner import certs
from labrunner.backends.base import SERVICE_STOP_ENV, listening_event, tail_file
from labrunner.backends.cgroups import enter_limits
from labrunner.backends.connections import CLOSE_WAIT, ESTABLISHED, seen_by
from labrunner.backends.local.service import SERVICE_KNOBS, terminate
from labrunner.observe import interference
from labrunner.paths import REPO
from labrunner.report.payload_model import Estimate
from labrunner.report.stats import CONFIDENCE, half_width, paired_ratio
from labrunner.say import Say
from services.common.metrics import FLUSH_SECONDS

# /2: every estimate as value, low, high (the first, unreleased, wrote mean and estimate): cases_of
# ignores a /1 document instead of failing on it.
SCHEMA = "protolab.handshakes/2"
FILE = "handshakes.json"  # in a run's directory
# The servers whose TLS handshakes are counted (docs/services.md, Metrics); Granian's and grpc.aio's
# TLS is not Python's, and nothing counts it.
COUNTING = ("rest_aiohttp", "rest_quart", "grpc_grpclib")
ROUNDS = 5
# Per phase and round: a phase of 0.25-0.35 s on the lab's VM (the client's 1.5-2.3 ms a connection), so that
# it and its counter check take one flush period (measure_server), with room on a busy host; some 0.1 s of
# server CPU. The defaults take about 23 s for the three servers.
HANDSHAKES = 150
WARMUP = 20  # full and as many resumed connections before the first round, counted but not measured
FULL, RESUMED, NO_HANDSHAKE = "full", "resumed", "no handshake"
PHASES = (FULL, RESUMED, NO_HANDSHAKE)
METRIC = "protolab_tls_handshakes"
# The ALPN the client offers: grpclib speaks HTTP/2 only, the REST servers get HTTP/1.1 (where the
# server sends nothing unasked, and Hypercorn would otherwise choose h2).
H2_SERVICES = frozenset({"grpc_grpclib"})
START_TIMEOUT_S = 60.0
COUNT_TIMEOUT_S = 10 * FLUSH_SECONDS  # for the counter to reach the plan: ten flushes
QUIET_TIMEOUT_S = 10.0  # for the server to close its connections after a phase
IO_TIMEOUT_S = 10.0


class HandshakeMismatch(Exception):
    """The server's counter, or what the client saw, is not the plan: the figures would not be the
    handshakes they claim to be."""


class BenchError(Exception):
    """The benchmark could not run a server (it did not start, or has no single worker)."""


@dataclass(frozen=True)
class HandshakeCase:
    """One server: its worker's CPU per connection of each kind, in µs."""

    service: str
    tls_version: str
    alpn: str | None
    rounds: int
    handshakes: int  # connections per phase and round
    warmup: int  # full, and as many resumed, connections before the first round
    # Means over the rounds with their Student t intervals; the ratio paired round by round.
    full_us: Estimate
    resumed_us: Estimate
    resumed_over_full: Estimate
    no_handshake_us: Estimate
    full_rounds_us: tuple[float, ...]
    resumed_rounds_us: tuple[float, ...]
    no_handshake_rounds_us: tuple[float, ...]
    counted_full: int  # the server's counter at the end, warm-up included: the plan's, checked
    counted_resumed: int
    client_resumed: int  # connections the client saw resume (session_reused), warm-up included
    idle_us_per_s: float  # the worker's CPU between phases, idle but for its metrics' flushes
    # The share of the host's CPUs that processes other than the worker and the client used during the
    # phases (observe.interference.others_share; /proc/stat counts 10 ms): above a few percent, the
    # figures were measured beside other work, which slows a server's CPU without taking it (caches,
    # the hypervisor).
    others_share: float
    server_cpu: int | None  # the CPU the server was pinned to; None: not pinned (one CPU available)
    client_cpu: int | None


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The arithmetic mean and its Student t interval, mean ± t·sd/√n with n - 1 degrees of freedom."""
    if not values:
        raise ValueError("mean_interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, None)
    margin = half_width(statistics.stdev(values), len(values), confidence)
    return Estimate(mean, mean - margin, mean + margin)


def resumed_over_full(resumed: Sequence[float], full: Sequence[float]) -> Estimate:
    """resumed / full with the rounds paired (each round's phases ran back to back, stats.paired_ratio):
    the geometric mean of the rounds' ratios and its interval (none with one round)."""
    r = paired_ratio(resumed, full)
    return Estimate(r.estimate, r.low, r.high)


def summarize_case(
    service: str,
    rounds_us: Mapping[str, Sequence[float]],
    seen: "Seen",
    *,
    handshakes: int,
    warmup: int,
    cpus: "Cpus",
) -> HandshakeCase:
    """The case of a server from its per-round µs per connection of each phase and what it saw."""
    full, resumed, bare = (tuple(rounds_us[phase]) for phase in PHASES)
    return HandshakeCase(
        service=service,
        tls_version=seen.version,
        alpn=seen.alpn,
        rounds=len(full),
        handshakes=handshakes,
        warmup=warmup,
        full_us=mean_interval(full),
        resumed_us=mean_interval(resumed),
        resumed_over_full=resumed_over_full(resumed, full),
        no_handshake_us=mean_interval(bare),
        full_rounds_us=full,
        resumed_rounds_us=resumed,
        no_handshake_rounds_us=bare,
        counted_full=seen.counted[0],
        counted_resumed=seen.counted[1],
        client_resumed=seen.client_resumed,
        idle_us_per_s=seen.idle_ns / 1000 / seen.idle_s if seen.idle_s else 0.0,
        others_share=seen.others_s / seen.phases_s if seen.phases_s else 0.0,
        server_cpu=cpus.server,
        client_cpu=cpus.client,
    )


# --- the document ---


def as_document(cases: Sequence[HandshakeCase]) -> dict[str, Any]:
    """handshakes.json: the cases plus what they ran on."""
    return {
        "schema": SCHEMA,
        "confidence": CONFIDENCE,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "openssl": ssl.OPENSSL_VERSION,
        "cpu": platform.processor() or platform.machine(),
        "cases": [asdict(case) for case in cases],
    }


def cases_of(document: Any) -> list[HandshakeCase]:
    """The cases of a handshakes.json; empty when it is not one."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return []
    return [_case(case) for case in document["cases"]]


def _case(fields: dict[str, Any]) -> HandshakeCase:
    estimates = {
        name: Estimate(**fields[name])
        for name in ("full_us", "resumed_us", "no_handshake_us", "resumed_over_full")
    }
    rounds = {
        name: tuple(fields[name])
        for name in ("full_rounds_us", "resumed_rounds_us", "no_handshake_rounds_us")
    }
    return HandshakeCase(**{**fields, **estimates, **rounds})


# --- the client ---


def client_context(service: str, ca_file: Path) -> ssl.SSLContext:
    """A client context trusting the lab's CA, offering the ALPN the service speaks."""
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"] if service in H2_SERVICES else ["http/1.1"])
    return context


@dataclass(frozen=True)
class Connection:
    """What the client saw of one TLS connection."""

    resumed: bool
    session: ssl.SSLSession  # read after the close, so it holds the tickets the server sent
    version: str
    alpn: str | None


def tls_connection(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None) -> Connection:
    """Connect, handshake offering session (None: a full handshake), close TLS cleanly, close.

    Memory BIOs, so that the session can be read after the close: a TLS 1.3 server sends its tickets
    after the handshake, and the client reads them only with what follows (here the server's
    close_notify); the session read right after the handshake holds no ticket and does not resume.
    An HTTP/2 server sends its SETTINGS (grpclib: SETTINGS, WINDOW_UPDATE, SETTINGS in one write) once
    the handshake completes: they are read before the close, or the close would meet data after it.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost", session=session)
        _until_done(tls.do_handshake, sock, incoming, outgoing)
        _send(sock, outgoing)  # the client's Finished
        alpn = tls.selected_alpn_protocol()
        if alpn == "h2":
            _read_h2_frames(tls, sock, incoming, outgoing)
        _until_done(tls.unwrap, sock, incoming, outgoing)
        _send(sock, outgoing)
        version = tls.version()
        if tls.session is None or version is None:
            raise BenchError("the connection completed with no session or version")
        return Connection(tls.session_reused, tls.session, version, alpn)


def _send(sock: socket.socket, outgoing: ssl.MemoryBIO) -> None:
    if data := outgoing.read():
        sock.sendall(data)


def _receive(sock: socket.socket, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
    _send(sock, outgoing)
    data = sock.recv(65536)
    if not data:
        raise BenchError("the server closed the connection mid-exchange")
    incoming.write(data)


def _until_done(
    step: Callable[[], object], sock: socket.socket, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
) -> None:
    while True:
        try:
            step()
            return
        except ssl.SSLWantReadError:
            _receive(sock, incoming, outgoing)


def _read_h2_frames(
    tls: ssl.SSLObject, sock: socket.socket, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
) -> None:
    """Read application data until it is whole HTTP/2 frames, at least one (the server's preface)."""
    data = b""
    while not _whole_frames(data):
        try:
            data += tls.read(65536)
        except ssl.SSLWantReadError:
            _receive(sock, incoming, outgoing)


def _whole_frames(data: bytes) -> bool:
    offset = 0
    while offset + 9 <= len(data):  # a frame: a 9-byte header whose first 3 bytes are the payload's length
        offset += 9 + int.from_bytes(data[offset : offset + 3], "big")
    return offset == len(data) > 0


def bare_connection(port: int) -> None:
    """Connect and close before any ClientHello: the server accepts and sets up TLS, no handshake."""
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S):
        pass


# --- the server ---


@dataclass(frozen=True)
class Cpus:
    """Where the server and the client run: one CPU each, or None each when only one is available."""

    server: int | None
    client: int | None


def choose_cpus() -> Cpus:
    """The last available CPU for the server, the first for the client (the lab's VM: 1 and 0)."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return Cpus(None, None)
    return Cpus(available[-1], available[0])


@dataclass(frozen=True)
class Server:
    """A started service: its supervisor's process, its ports, where its log goes."""

    service: str
    process: "subprocess.Popen[bytes]"
    port: int
    metrics_port: int
    log: Path


def server_env(certs_dir: Path) -> dict[str, str]:
    """The service's environment: this one's without the settings the runner decides, then ours."""
    env = {name: value for name, value in os.environ.items() if name not in SERVICE_KNOBS}
    return env | {
        "HOST": "127.0.0.1",
        "PORT": "0",
        "METRICS_PORT": "0",
        "WORKERS": "1",
        "METRICS_ENABLED": "1",
        "TLS_CERT_FILE": str(certs_dir / certs.SERVER_FILE),
        "TLS_KEY_FILE": str(certs_dir / certs.SERVER_KEY_FILE),
        "PYTHONUNBUFFERED": "1",
        **SERVICE_STOP_ENV,
    }


@contextlib.contextmanager
def serving(service: str, cpu: int | None, certs_dir: Path = certs.DEFAULT_DIR) -> Iterator[Server]:
    """`python -m services.<service>` with TLS and one worker, pinned to cpu; stopped (SIGTERM, then
    SIGKILL of its session) when the block ends."""
    server_cpus = tuple(sorted(os.sched_getaffinity(0))) if cpu is None else (cpu,)
    with tempfile.TemporaryDirectory(prefix="protolab-handshakes-") as scratch:
        log = Path(scratch) / "service.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", f"services.{service}"],
                cwd=REPO,
                env=server_env(certs_dir),
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,  # its own session: terminate() kills its workers too
                # Its CPU, and SIGTERM should this process die: only system calls between fork and exec.
                preexec_fn=functools.partial(enter_limits, None, server_cpus),  # noqa: PLW1509
            )
        try:
            assert process.stdout is not None
            listening = _await_listening(process.stdout, service, log)
            yield Server(service, process, listening["port"], listening["metrics_port"], log)
        finally:
            terminate(process, grace_s=5)


def _await_listening(stdout: IO[bytes], service: str, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stdout], [], [], 0.2)
        if not ready:
            continue
        line = stdout.readline()
        if not line:
            break
        if event := listening_event([line]):
            if not event.get("tls") or not event.get("metrics_port"):
                raise BenchError(f"{service} started without TLS or metrics: {event}")
            return event
    raise BenchError(f"{service} printed no listening line; its log ends:\n{tail_file(log)}")


def worker_pid(server: Server) -> int:
    """The server's one worker: the supervisor's child that is not multiprocessing's resource tracker
    (Hypercorn spawns its workers, and multiprocessing starts a tracker for them)."""
    supervisor, service = server.process.pid, server.service
    children = [
        int(pid)
        for task in Path(f"/proc/{supervisor}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    workers = [
        pid for pid in children if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    if len(workers) != 1:
        raise BenchError(f"{service}: expected one worker process under {supervisor}, found {workers}")
    return workers[0]


def cpu_ns(pid: int) -> dict[int, int]:
    """Each thread's run time so far, in ns (the first field of its schedstat): tid -> ns."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that just ended
            times[int(task.name)] = int((task / "schedstat").read_text().split()[0])
    return times


def cpu_between(before: Mapping[int, int], after: Mapping[int, int]) -> int:
    """The ns the threads ran between two cpu_ns readings; a thread that ended in between took its
    last run time with it (none of the servers' threads end while they serve)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items())


def open_connections(pid: int, port: int) -> int:
    """Sockets of the local port that process pid's server still holds: established, or half-closed by
    the client (0 once the process has ended)."""
    return seen_by(pid, port, (ESTABLISHED, CLOSE_WAIT)) or 0


def wait_closed(pid: int, port: int) -> None:
    """Until process pid's server has closed every connection of its port, those still in its accept
    queue too."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while open_connections(pid, port):
        if time.monotonic() > deadline:
            raise BenchError(f"connections to port {port} still open after {QUIET_TIMEOUT_S:g} s")
        time.sleep(0.001)


def handshake_counts(metrics_port: int) -> tuple[int, int] | None:
    """(full, resumed) from the server's protolab_tls_handshakes_total; None without the series."""
    response = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", trust_env=False, timeout=IO_TIMEOUT_S)
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        if family.name == METRIC:
            values = {sample.labels.get("resumed"): int(sample.value) for sample in family.samples}
            return values.get("false", 0), values.get("true", 0)
    return None


# --- one server ---


@dataclass
class Seen:
    """What a server's run saw so far: the plan, the counts and the client's view."""

    worker: int  # the worker's pid
    planned: tuple[int, int] = (0, 0)  # (full, resumed) handshakes made so far
    counted: tuple[int, int] = (0, 0)  # the server's counter at the last check
    client_resumed: int = 0
    version: str = ""
    alpn: str | None = None
    session: ssl.SSLSession | None = None  # the latest session, with its tickets: the next to offer
    idle_ns: int = 0  # the worker's CPU while the counter checks waited
    idle_s: float = 0.0
    phases_s: float = 0.0  # the phases' wall time
    others_s: float = 0.0  # others' share of the host's CPUs, times each phase's wall time


def measure_server(
    server: Server,
    rounds: int = ROUNDS,
    handshakes: int = HANDSHAKES,
    *,
    warmup: int = WARMUP,
    cpus: Cpus = Cpus(None, None),
    ca_file: Path = certs.DEFAULT_DIR / certs.CA_FILE,
) -> HandshakeCase:
    """The case of a server just started (serving): its counter must be at 0 and 0, and follow the plan."""
    service = server.service
    if handshake_counts(server.metrics_port) is None:
        raise HandshakeMismatch(
            f"{service} has no {METRIC}_total series: its TLS handshakes are not counted "
            f"(the counting servers: {', '.join(COUNTING)})"
        )
    worker = worker_pid(server)
    context = client_context(service, ca_file)
    seen = Seen(worker=worker)
    for kind in (FULL, RESUMED):
        _connections(server, context, kind, warmup, seen)
    _check(server, seen, "warm-up")
    rounds_us: dict[str, list[float]] = {phase: [] for phase in PHASES}
    unchecked: list[str] = []
    for index in range(rounds):
        for phase in PHASES if index % 2 == 0 else PHASES[::-1]:
            host, client, before = interference.read_snapshot(), time.thread_time_ns(), cpu_ns(worker)
            _connections(server, context, phase, handshakes, seen)
            wait_closed(server.process.pid, server.port)
            server_ns = cpu_between(before, cpu_ns(worker))
            own_s = (server_ns + time.thread_time_ns() - client) / 1e9
            host_after = interference.read_snapshot()
            seen.phases_s += host_after.at - host.at
            seen.others_s += interference.others_share(host, host_after, own_s) * (host_after.at - host.at)
            rounds_us[phase].append(server_ns / handshakes / 1000)
            unchecked.append(f"round {index + 1}'s {phase} phase")
            # A check waits for the worker's next flush, and a check's end is just after one: a phase
            # shorter than FLUSH_SECONDS and its check take one flush period. A phase without handshakes
            # adds nothing to wait for: the next check is its own.
            if phase != NO_HANDSHAKE:
                _check(server, seen, " then ".join(unchecked))
                unchecked = []
    _check(server, seen, " then ".join([*unchecked, "the end"]), settle=True)
    return summarize_case(service, rounds_us, seen, handshakes=handshakes, warmup=warmup, cpus=cpus)


def _connections(server: Server, context: ssl.SSLContext, phase: str, count: int, seen: Seen) -> None:
    """count connections of the phase; the client must see each resume as planned."""
    if phase == NO_HANDSHAKE:
        for _ in range(count):
            bare_connection(server.port)
        return
    resume = phase == RESUMED
    if resume and seen.session is None:
        raise BenchError("a resumed phase needs a session: the warm-up's full connections give one")
    resumed = 0
    for _ in range(count):
        connection = tls_connection(server.port, context, seen.session if resume else None)
        resumed += connection.resumed
        seen.session = connection.session
        if seen.version and (seen.version, seen.alpn) != (connection.version, connection.alpn):
            raise BenchError(
                f"{server.service}: one connection negotiated {connection.version} ({connection.alpn}), "
                f"another {seen.version} ({seen.alpn})"
            )
        seen.version, seen.alpn = connection.version, connection.alpn
    if resumed != (count if resume else 0):
        raise HandshakeMismatch(
            f"{server.service}: {resumed} of {count} connections of a {phase} phase resumed (client's "
            f"session_reused), planned {count if resume else 0}"
        )
    seen.client_resumed += resumed
    full, resumed_total = seen.planned
    seen.planned = (full, resumed_total + count) if resume else (full + count, resumed_total)


def _check(server: Server, seen: Seen, what: str, settle: bool = False) -> None:
    """The server's counter equals the plan: awaited (its worker writes it every FLUSH_SECONDS); with
    settle, read again two flushes later, so that a count past the plan shows too. The worker's CPU
    over the wait counts as idle."""
    before, began = cpu_ns(seen.worker), time.perf_counter()
    deadline = time.monotonic() + COUNT_TIMEOUT_S
    counted = handshake_counts(server.metrics_port)
    # Counts only grow: one past the plan fails at once.
    while counted is not None and counted != seen.planned and time.monotonic() < deadline:
        if counted[0] > seen.planned[0] or counted[1] > seen.planned[1]:
            break
        time.sleep(0.02)
        counted = handshake_counts(server.metrics_port)
    if settle and counted == seen.planned:
        time.sleep(2 * FLUSH_SECONDS)
        counted = handshake_counts(server.metrics_port)
    seen.idle_ns += cpu_between(before, cpu_ns(seen.worker))
    seen.idle_s += time.perf_counter() - began
    if counted != seen.planned:
        got = "no series" if counted is None else f"{counted[0]} full and {counted[1]} resumed"
        raise HandshakeMismatch(
            f"{server.service} counted {got} after {what} (protolab_tls_handshakes_total), planned "
            f"{seen.planned[0]} full and {seen.planned[1]} resumed"
        )
    seen.counted = counted


# --- every server ---


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """This thread on cpu for the block (the client), its affinity restored after."""
    if cpu is None:
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def run(
    rounds: int = ROUNDS,
    handshakes: int = HANDSHAKES,
    services: Sequence[str] = COUNTING,
    *,
    warmup: int = WARMUP,
    certs_dir: Path = certs.DEFAULT_DIR,
    say: Say | None = None,
) -> list[HandshakeCase]:
    """Each service's case, one server at a time; HandshakeMismatch when a server's counter or the
    client's view is not the plan, BenchError when a server cannot be measured."""
    if rounds < 1 or handshakes < 1 or warmup < 1:
        raise ValueError("rounds, handshakes and warmup must be at least 1")
    certs.ensure_certs(certs_dir)
    cpus = choose_cpus()
    cases = []
    with pinned(cpus.client):
        for service in services:
            if say:
                say(f"{service}: {rounds} rounds of {handshakes} connections per phase")
            with serving(service, cpus.server, certs_dir) as server:
                cases.append(
                    measure_server(
                        server,
                        rounds,
                        handshakes,
                        warmup=warmup,
                        cpus=cpus,
                        ca_file=certs_dir / certs.CA_FILE,
                    )
                )
    return cases
