"""Measure a link before measuring through it: the RTT by ICMP echo (and, for QUIC, by UDP echo), the
rate by a bulk transfer."""

import contextlib
import os
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from labrunner.network import docker_probe
from labrunner.network.namespaces import Link, entered
from labrunner.network.profiles import NetworkProfile

TOLERANCE = 0.10  # the issue's: a link more than 10% off its profile fails the scenario
# Below 2.5 ms, 10% is finer than the userspace relay can keep on a shared host (its wake-up
# compensation varies with the host); 0.25 ms absolute covers that and still tells lan from
# loopback, or from a link that lost its emulator. The measurements: docs/network.md.
RTT_FLOOR_S = 0.00025
LINK_MTU = 1500  # of the veth pair and the relay's TUN devices (their default)
_CHUNK = 64 * 1024
_TIMEOUT_S = 10.0
_PING_TIMEOUT_S = 1.0  # per echo: enough for profiles up to a few hundred ms of RTT
_ICMP_ECHO_REQUEST, _ICMP_ECHO_REPLY = 8, 0
# A UDP echo: magic, sequence, and (in the answer) the nanoseconds the echo server held it.
_UDP_ECHO = struct.Struct("!8sIq")
_UDP_MAGIC = b"plab-udp"
_ECHO_POLL_S = 0.1  # how soon the UDP echo server notices it should stop
# A link found off is measured again, this many times in all: on a busy host the relay's median
# RTT can spike once and be back within tolerance on the next measurement (seen in CI:
# docs/network.md); a link that is really off (no emulator, a wrong delay) stays off.
VERIFY_ATTEMPTS = 3
_RETRY_PAUSE_S = 0.5


class LinkVerificationError(RuntimeError):
    """The link is off its profile (or does not answer); the scenario must not be measured."""


@dataclass(frozen=True)
class LinkMeasurement:
    """What the link did: the median RTT of `rtt_samples`, and the rate of a bulk transfer; for a
    target that speaks QUIC, the median RTT of UDP echoes too."""

    rtt_s: float
    rtt_samples: tuple[float, ...]
    rate_bps: float | None  # IP bits/s, service to client (the responses' way); None: not measured
    udp_rtt_s: float | None = None  # the median of `udp_rtt_samples`; None: not measured
    udp_rtt_samples: tuple[float, ...] = ()

    def problems(self, profile: NetworkProfile) -> list[str]:
        """Why the link is off its profile; empty when it is within tolerance."""
        found = []
        allowed = max(TOLERANCE * profile.rtt_s, RTT_FLOOR_S)
        if abs(self.rtt_s - profile.rtt_s) > allowed:
            found.append(
                f"RTT {self.rtt_s * 1000:.3f} ms is more than {allowed * 1000:.3f} ms off "
                f"{profile.name}'s {profile.rtt_s * 1000:.3f} ms"
            )
        if self.udp_rtt_s is not None and abs(self.udp_rtt_s - profile.rtt_s) > allowed:
            found.append(
                f"UDP RTT {self.udp_rtt_s * 1000:.3f} ms is more than {allowed * 1000:.3f} ms off "
                f"{profile.name}'s {profile.rtt_s * 1000:.3f} ms"
            )
        rate, promised = self.rate_bps, profile.rate_bps
        if promised and rate is not None and abs(rate - promised) > TOLERANCE * promised:
            found.append(
                f"rate {rate / 1e6:.2f} Mbit/s is more than {TOLERANCE:.0%} off "
                f"{profile.name}'s {promised / 1e6:.2f} Mbit/s"
            )
        return found


def verify(
    link: Link, profile: NetworkProfile, samples: int = 21, transfer_s: float = 2.0, udp: bool = False
) -> LinkMeasurement:
    """Measure the link (the rate only when the profile limits it); LinkVerificationError when off.

    `udp`: the RTT by UDP echo too (measure_udp_rtt), for a target that speaks QUIC (HTTP/3).
    Off once is measured again (VERIFY_ATTEMPTS in all); the error names every attempt's problems.
    """
    attempts: list[str] = []
    for attempt in range(VERIFY_ATTEMPTS):
        if attempt:
            time.sleep(_RETRY_PAUSE_S)
        rtts = measure_rtt(link, samples)
        udp_rtts = measure_udp_rtt(link, samples) if udp else []
        rate = measure_rate(link, transfer_s) if profile.rate_bps else None
        measurement = LinkMeasurement(
            statistics.median(rtts),
            tuple(rtts),
            rate,
            statistics.median(udp_rtts) if udp_rtts else None,
            tuple(udp_rtts),
        )
        if not (problems := measurement.problems(profile)):
            return measurement
        attempts.append("; ".join(problems))
    raise LinkVerificationError(
        f"network {profile.name}, {VERIFY_ATTEMPTS} measurements: " + " | ".join(attempts)
    )


def measure_rtt(link: Link, samples: int = 21) -> list[float]:
    """Round trips of ICMP echo from the client's side to the service's address, in seconds.

    The service's kernel answers and the client's kernel timestamps each reply on arrival, so
    no process's scheduling is in the figure (a Python ping-pong on a busy host measures its
    own wake-ups too: docs/network.md, The RTT check). A ping lost on a lossy link is sent
    again; the first answer, which may include address resolution, is not counted.
    """
    with entered(link.client.namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, docker_probe.SO_TIMESTAMPNS, 1)
        ident = os.getpid() & 0xFFFF
        rtts: list[float] = []
        for sequence in range(2 * samples + 1):  # as many losses as samples at most
            sent = time.time_ns()  # CLOCK_REALTIME, as the kernel's receive timestamp
            try:
                sock.sendto(_echo_request(ident, sequence), (link.service.address, 0))
            except OSError as exc:  # e.g. no route: the emulator's relay died
                raise LinkVerificationError(f"cannot reach {link.service.address}: {exc}") from exc
            arrived = _reply_time(sock, ident, sequence, time.monotonic() + _PING_TIMEOUT_S)
            if arrived is not None:
                rtts.append((arrived - sent) / 1e9)
            if len(rtts) == samples + 1:
                return rtts[1:]
    raise LinkVerificationError(
        f"{link.service.address} answered {len(rtts)} of {2 * samples + 1} pings within {_PING_TIMEOUT_S} s"
    )


def _echo_request(ident: int, sequence: int) -> bytes:
    """An ICMP echo request with its checksum (RFC 792: ones' complement of the 16-bit word sum)."""
    payload = b"protolab"  # an even length: whole 16-bit words
    unsummed = struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0, 0, ident, sequence) + payload
    total = sum(struct.unpack(f"!{len(unsummed) // 2}H", unsummed))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0, ~total & 0xFFFF, ident, sequence) + payload


def _reply_time(sock: socket.socket, ident: int, sequence: int, deadline: float) -> int | None:
    """The kernel's arrival time (ns) of the echo reply `sequence`, or None at the deadline."""
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            packet, ancillary, _, _ = sock.recvmsg(2048, socket.CMSG_SPACE(16))
        except TimeoutError:
            return None
        icmp = packet[(packet[0] & 0x0F) * 4 :]  # after the IP header
        kind, _, _, got_ident, got_sequence = struct.unpack("!BBHHH", icmp[:8])
        if (kind, got_ident, got_sequence) != (_ICMP_ECHO_REPLY, ident, sequence):
            continue  # a late reply to an earlier ping, or other ICMP traffic in the namespace
        return _kernel_time(ancillary)
    return None


def _kernel_time(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive timestamp (ns, CLOCK_REALTIME) of a datagram read with SO_TIMESTAMPNS."""
    for level, cmsg_type, data in ancillary:
        if (level, cmsg_type) == (socket.SOL_SOCKET, docker_probe.SO_TIMESTAMPNS):
            seconds, nanoseconds = struct.unpack("qq", data[:16])  # struct timespec
            return int(seconds) * 1_000_000_000 + int(nanoseconds)
    raise LinkVerificationError("the kernel gave the echo reply no timestamp")


def measure_udp_rtt(link: Link, samples: int = 21, timeout_s: float = _PING_TIMEOUT_S) -> list[float]:
    """Round trips of UDP echoes from the client's side to the service's address, in seconds.

    What QUIC's packets cross: an echo server on the service's address, inside its namespace,
    answers each datagram with how long it held it (from its kernel's arrival timestamp to its
    answer), which is taken off; the client's kernel timestamps each answer on arrival. So, as
    with measure_rtt's ICMP, neither process's wake-ups are in the figure. A datagram (or its
    answer) lost on a lossy link is sent again after `timeout_s`; the first answer is not
    counted; fewer than `samples` + 1 answers out of 2 * `samples` + 1 datagrams fail the check.
    """
    with _udp_echo_server(link) as port:
        with entered(link.client.namespace):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, docker_probe.SO_TIMESTAMPNS, 1)
            target = f"{link.service.address}:{port}"
            rtts: list[float] = []
            try:
                sock.connect((link.service.address, port))  # and only its answers arrive here
                for sequence in range(2 * samples + 1):  # as many losses as samples at most
                    sent = time.time_ns()  # CLOCK_REALTIME, as the kernel's receive timestamp
                    sock.send(_UDP_ECHO.pack(_UDP_MAGIC, sequence, 0))
                    answer = _udp_answer(sock, sequence, time.monotonic() + timeout_s)
                    if answer is not None:
                        arrived, held = answer
                        rtts.append((arrived - sent - held) / 1e9)
                    if len(rtts) == samples + 1:
                        return rtts[1:]
            except OSError as exc:  # e.g. no route: the emulator's relay died
                raise LinkVerificationError(f"cannot reach {target} over UDP: {exc}") from exc
    raise LinkVerificationError(
        f"{target} answered {len(rtts)} of {2 * samples + 1} UDP echoes within {timeout_s} s"
    )


def _udp_answer(sock: socket.socket, sequence: int, deadline: float) -> tuple[int, int] | None:
    """The kernel's arrival time (ns) of the answer to UDP echo `sequence` and how long the echo
    server held it (ns), or None at the deadline."""
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            data, ancillary, _, _ = sock.recvmsg(_UDP_ECHO.size, socket.CMSG_SPACE(16))
        except TimeoutError:
            return None
        if len(data) != _UDP_ECHO.size:
            continue
        magic, got_sequence, held = _UDP_ECHO.unpack(data)
        if (magic, got_sequence) == (_UDP_MAGIC, sequence):
            return _kernel_time(ancillary), held
        # else: a late answer to an earlier datagram
    return None


@contextlib.contextmanager
def _udp_echo_server(link: Link) -> Iterator[int]:
    """A UDP echo server on the service's address, inside its namespace; yields the port.

    Each answer carries the nanoseconds from the datagram's arrival (the kernel's timestamp) to
    the answer, so that the server's own scheduling can be taken off the round trip.
    """
    with entered(link.service.namespace):
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stop = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                data, ancillary, _, peer = server.recvmsg(_UDP_ECHO.size, socket.CMSG_SPACE(16))
                arrived = _kernel_time(ancillary)
                if len(data) != _UDP_ECHO.size or data[: len(_UDP_MAGIC)] != _UDP_MAGIC:
                    continue  # not an echo of ours
                _, sequence, _ = _UDP_ECHO.unpack(data)
                server.sendto(_UDP_ECHO.pack(_UDP_MAGIC, sequence, time.time_ns() - arrived), peer)
            except TimeoutError:
                continue
            except (OSError, LinkVerificationError) as exc:
                failure.append(exc)
                return

    with server:
        server.bind((link.service.address, 0))
        server.setsockopt(socket.SOL_SOCKET, docker_probe.SO_TIMESTAMPNS, 1)
        server.settimeout(_ECHO_POLL_S)
        thread = threading.Thread(target=serve, name="link-udp-echo", daemon=True)
        thread.start()
        try:
            yield server.getsockname()[1]
        finally:
            stop.set()
            thread.join(_TIMEOUT_S)
    if failure:
        raise LinkVerificationError(f"the UDP echo server failed: {failure[0]}")


def measure_rate(link: Link, seconds: float = 2.0) -> float:
    """The link's rate, in bits per second of IP packets, from the service's side to the client's.

    A bulk TCP transfer of `seconds`, measured as the docker backend's probe measures it
    (docker_probe.receive_rate: by the kernel's arrival times, the median of slices after the first
    quarter), so that neither a descheduled probe nor a rate limiter's burst moves the figure.
    """
    stop = threading.Event()

    def send(conn: socket.socket) -> None:
        block = bytes(_CHUNK)
        with contextlib.suppress(OSError):  # the client closes when it has seen enough
            while not stop.is_set():
                conn.sendall(block)

    with _served(link, send) as port, _connected(link, port) as client:
        try:
            return docker_probe.receive_rate(client, seconds, LINK_MTU)
        except RuntimeError as exc:  # the transfer ended early, or gave too little to time
            raise LinkVerificationError(f"the bulk transfer to {link.client.address}: {exc}") from exc
        finally:
            stop.set()


@contextlib.contextmanager
def _served(link: Link, handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A one-connection TCP server on the service's address, inside its namespace; yields the port."""
    with entered(link.service.namespace):
        server = socket.create_server((link.service.address, 0))
    server.settimeout(_TIMEOUT_S)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                handle(conn)
        except OSError as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve, name="link-probe", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        thread.join(_TIMEOUT_S)
        server.close()
    if failure and not isinstance(failure[0], ConnectionError):
        raise LinkVerificationError(f"the probe server failed: {failure[0]}")


@contextlib.contextmanager
def _connected(link: Link, port: int) -> Iterator[socket.socket]:
    """A TCP connection from the client's namespace to the probe server."""
    with entered(link.client.namespace):
        try:
            client = socket.create_connection((link.service.address, port), timeout=_TIMEOUT_S)
        except OSError as exc:
            raise LinkVerificationError(f"cannot reach {link.service.address}:{port}: {exc}") from exc
    with client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            yield client
        except TimeoutError as exc:
            raise LinkVerificationError(f"no answer within {_TIMEOUT_S:.0f} s: {exc}") from exc
