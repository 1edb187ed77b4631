"""The userspace relay's own cost: CPU per packet and its packets/s ceiling (`python -m` this module)."""

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from labrunner.network.emulators import UserspaceEmulator
from labrunner.network.namespaces import Link, create_link, entered, plan_link, remove_link
from labrunner.network.profiles import NetworkProfile

_SINK_BUFFER = 1 << 20


@dataclass(frozen=True)
class RelayBenchmark:
    """A UDP flood through the relay: what it forwarded per second and what each packet cost it."""

    seconds: float
    packet_bytes: int
    offered_pps: float  # what the sender managed to send
    forwarded_pps: float
    relay_cpu: float  # share of one CPU the relay used
    relay_waited: float  # share of the time the relay was runnable but another task had its CPU
    cpu_us_per_packet: float

    @property
    def saturated(self) -> bool:
        """True when the relay always wanted to run: forwarded_pps is then its ceiling on this host."""
        return self.relay_cpu + self.relay_waited >= 0.9

    @property
    def ceiling_pps(self) -> int:
        """What the relay would forward with a whole CPU to itself."""
        return round(1e6 / self.cpu_us_per_packet)


def flood(link: Link, emulator: UserspaceEmulator, seconds: float, packet_bytes: int) -> RelayBenchmark:
    """Send UDP from the client's side to the service's as fast as one Python thread can, through the relay.

    The receiving socket is never read: the kernel drops what overflows it, silently (no ICMP
    back through the relay), so only the relay and the sender do per-packet work.
    """
    with entered(link.service.namespace):
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with entered(link.client.namespace):
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sink, sender:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SINK_BUFFER)
        sink.bind((link.service.address, 0))
        sender.connect(sink.getsockname())
        payload = bytes(packet_bytes)
        before = emulator.usage(link)
        start, sent = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                try:
                    sender.send(payload)
                    sent += 1
                except OSError:  # ENOBUFS when the TUN device's queue is full: the relay is behind
                    pass
        time.sleep(0.05)  # let the relay drain what the delay holds
        after = emulator.usage(link)
        elapsed = time.perf_counter() - start
    forwarded = after.forwarded - before.forwarded
    cpu = after.cpu_s - before.cpu_s
    return RelayBenchmark(
        seconds=round(elapsed, 2),
        packet_bytes=packet_bytes,
        offered_pps=round(sent / elapsed),
        forwarded_pps=round(forwarded / elapsed),
        relay_cpu=round(cpu / elapsed, 2),
        relay_waited=round((after.runqueue_wait_s - before.runqueue_wait_s) / elapsed, 2),
        cpu_us_per_packet=round(cpu / max(1, after.received - before.received) * 1e6, 1),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--relay-cpu", type=int, default=(os.cpu_count() or 1) - 1, help="CPU to pin the relay to"
    )
    parser.add_argument("--sender-cpu", type=int, default=0, help="CPU the sender runs on")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--bytes", type=int, default=64, help="UDP payload per packet")
    parser.add_argument(
        "--delay", type=float, default=1.0, help="one-way delay in ms (packets wait in the heap)"
    )
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.sender_cpu})
    link = create_link(plan_link("bench", str(os.getpid())))
    emulator = UserspaceEmulator([args.relay_cpu])
    try:
        emulator.apply(link, NetworkProfile("bench", delay_s=args.delay / 1000))
        result = flood(link, emulator, args.seconds, args.bytes)
    finally:
        emulator.remove(link)
        remove_link(link)
    print(json.dumps({**asdict(result), "saturated": result.saturated, "ceiling_pps": result.ceiling_pps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
