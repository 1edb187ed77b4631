"""The docker backend's link probe: RTT and bulk rate between k6's network and the service container.

Runs inside the network helper image (Python's standard library only: the file is mounted there
alone), in two containers:
  serve    in the service container's network namespace: a TCP port that accepts connections;
           a client that sends b"R" gets zeros until it closes (the bulk transfer)
  measure  on k6's network: RTT samples as TCP connect times to `serve` (the kernels answer the
           handshake, so no process's scheduling is in the figure but the prober's own), then
           the rate of a bulk transfer from the service's side; prints one JSON line.
receive_rate is also how network/link_checks.py measures a rate between namespaces: one method.
"""

import argparse
import contextlib
import json
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

_CHUNK = 64 * 1024
_TIMEOUT_S = 10.0
# A bulk transfer's reads: small, so that each read's arrival time (its last packet's) dates
# all of its bytes closely; the counted time is cut into this many slices.
_RATE_READ = 16 * 1024
_RATE_SLICES = 8
SO_TIMESTAMPNS = 35  # asm-generic/socket.h; also the control message's type (SCM_TIMESTAMPNS)
_CONNECT_RETRY_S = 10.0  # the serve container may not be listening yet
_DEFAULT_MTU = 1500


def serve(port: int, timeout_s: float) -> None:
    """Accept connections until a bulk transfer ends or `timeout_s` passes without a connection."""
    with socket.create_server(("0.0.0.0", port), backlog=64) as server:
        print(json.dumps({"event": "listening", "port": port}), flush=True)
        server.settimeout(timeout_s)
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(_TIMEOUT_S)
                try:
                    wanted = conn.recv(1)
                except OSError:
                    continue
                if wanted != b"R":
                    continue  # an RTT sample: connected, closed
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                block = bytes(_CHUNK)
                with contextlib.suppress(OSError):  # the client closes when it has seen enough
                    while True:
                        conn.sendall(block)
                return


def connect_time(host: str, port: int) -> float:
    """One TCP handshake's duration, in seconds."""
    started = time.perf_counter()
    with socket.create_connection((host, port), timeout=_TIMEOUT_S):
        return time.perf_counter() - started


def measure_rtt(host: str, port: int, samples: int) -> list[float]:
    """`samples` handshakes after a first one (retried until `serve` listens), which is not counted."""
    deadline = time.monotonic() + _CONNECT_RETRY_S
    while True:
        try:
            connect_time(host, port)  # also resolves the peer's MAC address: not a sample
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return [connect_time(host, port) for _ in range(samples)]


def measure_rate(host: str, port: int, seconds: float, mtu: int) -> float:
    """IP bits/s of a bulk transfer from `serve` (receive_rate)."""
    with socket.create_connection((host, port), timeout=_TIMEOUT_S) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.sendall(b"R")
        return receive_rate(client, seconds, mtu)


def receive_rate(client: socket.socket, seconds: float, mtu: int) -> float:
    """The rate, in IP bits/s, of a bulk transfer arriving on `client` for `seconds`.

    - Bytes count when the kernel received them (SO_TIMESTAMPNS), not when this process reads
      them: a reader descheduled on a busy host reads a backlog at once, which would count as rate.
    - The first quarter is not counted: slow start.
    - The rate is the median over _RATE_SLICES equal slices of the counted time. A sender
      descheduled for long enough leaves the link idle, and a rate limiter's bucket fills meanwhile
      and is then spent at line rate (tbf's burst): moments below and above the rate the link
      holds, which fall into few slices.
    - The payload rate is scaled by MTU / MSS, because tbf counts the headers too: a 10 Mbit/s
      link carries ~9.6 Mbit/s of payload.
    """
    client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    start = time.time()  # CLOCK_REALTIME, the kernel's timestamps' clock
    counted_from = start + seconds / 4
    arrivals: list[tuple[float, int]] = []  # (a read's last packet's arrival, its bytes)
    while time.time() < start + seconds:
        data, ancillary, _, _ = client.recvmsg(_RATE_READ, socket.CMSG_SPACE(16))
        if not data:
            raise RuntimeError("the bulk transfer ended early")
        arrived = _arrival(ancillary)
        # Untimed: data that arrived before the timestamps were switched on, before `start`.
        if arrived is not None and arrived >= counted_from:
            arrivals.append((arrived, len(data)))
    mss = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)  # payload per full packet
    return median_slice_rate(arrivals, _RATE_SLICES) * 8 * mtu / mss


def median_slice_rate(arrivals: list[tuple[float, int]], slices: int) -> float:
    """Bytes/s: the median over `slices` equal slices of the time from the first arrival to the last.

    The first read only marks the start: its bytes arrived up to then.
    """
    if len(arrivals) <= slices or arrivals[-1][0] <= arrivals[0][0]:
        raise RuntimeError(f"the bulk transfer gave {len(arrivals)} reads to count, too few to time")
    begin, end = arrivals[0][0], arrivals[-1][0]
    width = (end - begin) / slices
    counted = [0] * slices
    for arrived, size in arrivals[1:]:
        counted[min(int((arrived - begin) / width), slices - 1)] += size
    return statistics.median(counted) / width


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The kernel's arrival time of a read's last packet (its SCM_TIMESTAMPNS message), if timed."""
    for level, kind, data in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
            seconds, nanoseconds = struct.unpack("qq", data[:16])  # struct timespec
            return int(seconds) + int(nanoseconds) / 1e9
    return None


def own_address(host: str) -> str:
    """This side's address towards `host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))
        return str(sock.getsockname()[0])


def interface_mtu(device: str = "eth0") -> int:
    try:
        return int(Path(f"/sys/class/net/{device}/mtu").read_text())
    except (OSError, ValueError):
        return _DEFAULT_MTU


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve")
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--timeout", type=float, default=60.0)
    measuring = commands.add_parser("measure")
    measuring.add_argument("--host", required=True)
    measuring.add_argument("--port", type=int, required=True)
    measuring.add_argument("--samples", type=int, default=21)
    measuring.add_argument("--rate-seconds", type=float, default=0.0, help="0: no bulk transfer")
    measuring.add_argument("--mtu", type=int, default=0, help="0: eth0's")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.port, args.timeout)
        return 0
    try:
        rtts = measure_rtt(args.host, args.port, args.samples)
        mtu = args.mtu or interface_mtu()
        rate = measure_rate(args.host, args.port, args.rate_seconds, mtu) if args.rate_seconds else None
    except (OSError, RuntimeError) as exc:
        print(json.dumps({"event": "failed", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    result = {"event": "measured", "address": own_address(args.host), "rtt_s": rtts, "rate_bps": rate}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
