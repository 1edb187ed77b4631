"""What the abuse suite (tests/integration/test_abuse_*.py) shares: each server and floor started in its
own cgroup at the small profile's limits (0.5 CPU, 512 MiB), its memory peak read back, and a raw HTTP/2
connection (the h2 library) for frames no well-behaved client sends."""

import contextlib
import multiprocessing
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from labrunner.backends.cgroups import (
    Cgroup,
    CgroupUnavailable,
    create_cgroup,
    join_cgroup,
    remove_cgroup,
    reset_memory_peak,
)

from tests.support import CERTS, RunningService, launch_service

__all__ = ["CERTS"]

CPUS = 0.5  # matrix.toml profile "small"
MEMORY_BYTES = 512 * 2**20
GRPC_MODULES = ("grpc_aio", "grpc_grpclib")
REST_MODULES = ("rest_aiohttp", "rest_quart", "rest_granian")


# (package, module) of every lab server and floor server of these modules.
def implementations(modules: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(package, module) for package in ("services", "benchmarks.floor") for module in modules]


def ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{'floor' if package != 'services' else 'lab'}-{module}" for package, module in pairs]


@dataclass
class Confined:
    """A service in its own cgroup with the small profile's limits."""

    service: RunningService
    cgroup: Cgroup

    def alive(self) -> bool:
        return self.service.process.poll() is None

    def reset_peak(self) -> None:
        assert reset_memory_peak(self.cgroup), "this kernel cannot reset the memory peak"

    def memory(self) -> tuple[int, int]:
        """The memory peak since the last reset, and how often usage ran into the limit (OOM pressure)."""
        memory = self.cgroup.paths.memory
        if self.cgroup.version == 1:
            return int((memory / "memory.max_usage_in_bytes").read_text()), int(
                (memory / "memory.failcnt").read_text()
            )
        events = dict(line.split() for line in (memory / "memory.events").read_text().splitlines())
        return int((memory / "memory.peak").read_text()), int(events["max"])

    def unharmed(self) -> int:
        """Asserts the server lives and its memory stayed under the limit since the last reset_peak
        (never ran into it); the peak, in bytes."""
        peak, hits = self.memory()
        assert self.alive(), "the server died"
        assert peak < MEMORY_BYTES and hits == 0, (peak, hits)
        return peak


@contextlib.contextmanager
def confined(
    package: str, module: str, env: dict[str, str] | None = None, stderr: IO[str] | None = None
) -> Iterator[Confined]:
    """The server started in a fresh cgroup (its stderr to `stderr`, else the test's); killed and its
    cgroup removed afterwards."""
    name = f"test-abuse-{module}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        cgroup = create_cgroup(name, CPUS, MEMORY_BYTES)
    except CgroupUnavailable as exc:
        pytest.fail(f"the abuse suite needs a writable cgroup (run as root): {exc}")
    try:
        service = launch_service(
            module, env, preexec_fn=lambda: join_cgroup(cgroup), package=package, stderr=stderr
        )
        try:
            yield Confined(service, cgroup)
        finally:
            service.kill()
    finally:
        remove_cgroup(cgroup)


class RawH2:
    """One HTTP/2 connection (cleartext, or TLS with ALPN h2) driven frame by frame with the h2 library."""

    def __init__(self, port: int, timeout: float = 10, tls: bool = False) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls:
            self.sock = client_ssl_context(["h2"]).wrap_socket(self.sock, server_hostname="localhost")
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.flush()
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def grpc_headers(self, stream_id: int, path: str, port: int) -> None:
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "3S"),
        ]  # fmt: skip
        self.conn.send_headers(stream_id, headers)

    def events(self) -> list[h2.events.Event]:
        """The events of what the server sent next; [] once it closed the connection."""
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ssl.SSLEOFError):  # closed without a TLS close_notify
            data = b""
        if not data:
            self.closed = True
            return []
        events = self.conn.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        try:
            self.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):  # the server has closed
            self.closed = True
        return list(events)

    def grpc_status(self, stream_id: int) -> tuple[int | None, str]:
        """The stream's grpc-status and grpc-message (None: the stream or connection ended without one)."""
        headers: dict[str, str] = {}
        while not self.closed:
            for event in self.events():
                answer = isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived)
                if answer and event.stream_id == stream_id:
                    headers.update(dict(event.headers))  # type: ignore[attr-defined]
                    if "grpc-status" in headers:
                        return int(headers["grpc-status"]), headers.get("grpc-message", "")
                if isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
                    return None, f"RST_STREAM {event.error_code!r}"
                if isinstance(event, h2.events.ConnectionTerminated):
                    return None, f"GOAWAY {event.error_code!r}"
        return None, "connection closed"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def client_ssl_context(alpn: list[str]) -> ssl.SSLContext:
    """A TLS client context that trusts the lab's CA (as every lab client does) and offers alpn."""
    context = ssl.create_default_context(cafile=str(CERTS / "ca.pem"))
    context.set_alpn_protocols(alpn)
    return context


@dataclass(frozen=True)
class Flood:
    """HTTP/2 rapid reset (CVE-2023-44487) from `connections` processes (their own GIL, at the lowest
    priority, so the health checks of the test's process are not starved by the flood's): each sends
    HEADERS then RST_STREAM for stream after stream, reconnecting whenever the server closes its
    connection."""

    port: int
    tls: bool
    path: str
    grpc: bool
    connections: int = 2

    @contextlib.contextmanager
    def running(self) -> Iterator["FloodCounts"]:
        spawn = multiprocessing.get_context("spawn")
        counts = FloodCounts(spawn.Value("q", 0), spawn.Value("q", 0))
        stop = spawn.Event()
        processes = [
            spawn.Process(target=_flood, args=(self, counts, stop), daemon=True)
            for _ in range(self.connections)
        ]
        for process in processes:
            process.start()
        try:
            yield counts
        finally:
            stop.set()
            for process in processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()


@dataclass(frozen=True)
class FloodCounts:
    streams: Any  # multiprocessing Values: streams opened and connections made, over all processes
    connects: Any


def _flood(flood: Flood, counts: FloodCounts, stop: Any) -> None:
    # An attacker's CPU is its own; here it shares the host's 2 vCPUs with the server and the health
    # checks, so it yields to them instead of measuring the host's contention.
    os.nice(10)
    scheme = "https" if flood.tls else "http"
    common = [(":scheme", scheme), (":path", flood.path), (":authority", "localhost")]
    if flood.grpc:
        headers = [(":method", "POST"), *common, ("content-type", "application/grpc"), ("te", "trailers")]
    else:
        headers = [(":method", "GET"), *common]
    while not stop.is_set():
        with contextlib.suppress(OSError, h2.exceptions.H2Error):
            _flood_connection(flood, headers, counts, stop)


def _flood_connection(flood: Flood, headers: list[tuple[str, str]], counts: FloodCounts, stop: Any) -> None:
    sock = socket.create_connection(("127.0.0.1", flood.port), timeout=5)
    try:
        if flood.tls:
            sock = client_ssl_context(["h2"]).wrap_socket(sock, server_hostname="localhost")
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        with counts.connects.get_lock():
            counts.connects.value += 1
        while not stop.is_set():
            for _ in range(50):
                stream_id = conn.get_next_available_stream_id()
                conn.send_headers(stream_id, headers, end_stream=not flood.grpc)
                conn.reset_stream(stream_id)
            sock.setblocking(True)
            sock.sendall(conn.data_to_send())
            with counts.streams.get_lock():
                counts.streams.value += 50
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError, ssl.SSLWantReadError):
                while data := sock.recv(65536):
                    conn.receive_data(data)
                return  # b"": the server closed the connection
    finally:
        with contextlib.suppress(OSError):
            sock.close()
