"""The docker backend's link probe: RTT and bulk rate between k6's network and the service container.

Runs inside the network helper image (Python's standard library only: the file is mounted there
alone), in two containers:
  serve    in the service container's network namespace: a TCP port that accepts connections;
           a client that sends b"R" gets zeros until it closes (the bulk transfer)
  measure  on k6's network: RTT samples as TCP connect times to `serve` (the kernels answer the
           handshake, so no process's scheduling is in the figure but the prober's own), then
           the rate of a bulk transfer from the service's side, as network/link_checks.py measures it
           between namespaces; prints one JSON line.
"""

import argparse
import contextlib
import json
import socket
import sys
import time
from pathlib import Path

_CHUNK = 64 * 1024
_TIMEOUT_S = 10.0
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
    """IP bits/s from the service's side, as verify.measure_rate: the first quarter is not counted,
    the payload rate is scaled by MTU / MSS because tbf counts the headers too."""
    with socket.create_connection((host, port), timeout=_TIMEOUT_S) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.sendall(b"R")
        start = time.perf_counter()
        counted_from, first, counted = start + seconds / 4, 0.0, 0
        while (now := time.perf_counter()) < start + seconds:
            received = len(client.recv(_CHUNK))
            if not received:
                raise RuntimeError("the bulk transfer ended early")
            if not first and now >= counted_from:
                first = time.perf_counter()
            elif first:
                counted += received
        last = time.perf_counter()
        mss = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    return counted * 8 / (last - first) * mtu / mss


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
