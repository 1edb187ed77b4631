"""The userspace link emulator: a relay between two TUN devices that delays and drops packets like netem."""

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from labrunner.network.namespaces import entered

_TUNSETIFF = 0x400454CA  # linux/if_tun.h: _IOW('T', 202, int)
_IFF_TUN = 0x0001  # IP packets, no Ethernet header: nothing to ARP for
_IFF_NO_PI = 0x1000  # no 4-byte packet-information prefix
_PR_SET_PDEATHSIG = 1
_PR_SET_TIMERSLACK = 29
_BATCH = 64  # packets read from one device before releasing what is due
_MAX_PACKET = 65536
_RT_PRIORITY = 10  # SCHED_FIFO: above every normal task, below the kernel's own threads (50)
_MAX_WAKE_S = 0.0001  # a wake-up latency beyond this is a busy host, not the timer
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclass(frozen=True)
class RelayConfig:
    """What each direction does to a packet: netem's delay, jitter, loss and queue limit."""

    delay_s: float
    jitter_s: float
    loss: float  # probability, 0..1
    limit: int  # packets waiting per direction; more are dropped (netem's `limit`)
    seed: int | None = None


class _Stop(Exception):
    """SIGTERM: leave the loop (an exception, so that select() is not simply retried)."""


def open_tun(namespace: str, name: str) -> int:
    """A non-blocking TUN device created inside `namespace`, gone when the descriptor closes.

    So a relay that dies for any reason takes its devices (and their routes) with it.
    """
    with entered(namespace):
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
    return fd


def wake_latency(samples: int = 101, sleep_s: float = 0.0002) -> float:
    """The median lateness of a short select() timeout on this CPU (at most _MAX_WAKE_S).

    Measured at real-time priority, so it is the timer's and the hypervisor's latency, not a
    wait for a busy CPU (which no schedule could anticipate).
    """
    late = []
    for _ in range(samples):
        start = time.monotonic()
        select.select([], [], [], sleep_s)
        late.append(time.monotonic() - start - sleep_s)
    return min(max(0.0, sorted(late)[samples // 2]), _MAX_WAKE_S)


class Relay:
    """Moves IPv4 packets between two TUN descriptors, each after its own delay, unless lost."""

    def __init__(self, fds: tuple[int, int], config: RelayConfig) -> None:
        self._peer = {fds[0]: fds[1], fds[1]: fds[0]}
        self._config = config
        self._random = random.Random(config.seed)
        # (due, sequence, out fd, packet): the sequence keeps equal due times in arrival order.
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._queued = dict.fromkeys(fds, 0)
        self._sequence = 0
        self.counters = {"received": 0, "forwarded": 0, "lost": 0, "overflow": 0, "ignored": 0}
        self._late_sum_s = 0.0
        self._late_max_s = 0.0
        # How late the relay wakes up, even with timer slack 1 ns (measured: docs/network.md, The
        # userspace relay). A packet is released once its due time is that close, and counted as
        # arrived that long before it was read (it woke the relay), so it spends its delay, not
        # delay + 2 wake-ups.
        self._wake_s = wake_latency()

    def run(self) -> None:
        """Relay until _Stop is raised (by the SIGTERM handler)."""
        fds = list(self._peer)
        while True:
            wake = self._heap[0][0] - self._wake_s if self._heap else None
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            readable, _, _ = select.select(fds, [], [], timeout)
            for fd in readable:
                self._receive(fd)
            self._release()

    def _receive(self, fd: int) -> None:
        config, arrived = self._config, time.monotonic() - self._wake_s
        for _ in range(_BATCH):
            try:
                packet = os.read(fd, _MAX_PACKET)
            except BlockingIOError:
                return
            self.counters["received"] += 1
            out = self._peer[fd]
            if not packet or packet[0] >> 4 != 4:
                # The link carries the two IPv4 addresses; IPv6 chatter (router solicitations) stays home.
                self.counters["ignored"] += 1
            elif config.loss and self._random.random() < config.loss:
                self.counters["lost"] += 1
            elif self._queued[out] >= config.limit:
                self.counters["overflow"] += 1
            else:
                jitter = self._random.uniform(-config.jitter_s, config.jitter_s) if config.jitter_s else 0.0
                # Each packet is delayed on its own, so jitter may reorder packets, as it does in netem.
                heapq.heappush(self._heap, (arrived + config.delay_s + jitter, self._sequence, out, packet))
                self._sequence += 1
                self._queued[out] += 1

    def _release(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] - self._wake_s <= now:
            due, _, out, packet = heapq.heappop(self._heap)
            self._queued[out] -= 1
            late = now - due  # negative when released early against the wake-up latency
            self._late_sum_s += late
            self._late_max_s = max(self._late_max_s, late)
            try:
                os.write(out, packet)
                self.counters["forwarded"] += 1
            except BlockingIOError:
                self.counters["overflow"] += 1

    def stats(self, event: str) -> dict[str, object]:
        """The counters, the relay's CPU seconds and how late packets left (the timer's error)."""
        times = os.times()
        forwarded = self.counters["forwarded"]
        # Time spent runnable but waiting for the CPU: other work on the relay's CPUs delays packets.
        with open("/proc/self/schedstat") as schedstat:
            waited_ns = int(schedstat.read().split()[1])
        return {
            "event": event,
            **self.counters,
            "cpu_s": round(times.user + times.system, 3),
            "runqueue_wait_s": round(waited_ns / 1e9, 3),
            "late_mean_us": round(self._late_sum_s / forwarded * 1e6, 1) if forwarded else 0.0,
            "late_max_us": round(self._late_max_s * 1e6, 1),
            "wake_us": round(self._wake_s * 1e6, 1),  # the compensation applied
        }


def _emit(line: dict[str, object]) -> None:
    print(json.dumps(line), flush=True)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def main(argv: Sequence[str] | None = None) -> int:
    """Run by UserspaceEmulator as `python -m labrunner.network.relay`.

    It opens one TUN device in each namespace, prints one JSON line ({"event": "ready"}), then
    relays until SIGTERM and prints its counters ({"event": "stopped"}); SIGUSR1 prints them
    ({"event": "stats"}) and it carries on.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", nargs=2, required=True, metavar="NS", help="the two sides")
    parser.add_argument("--device", required=True, help="TUN device name in each namespace")
    parser.add_argument("--delay-us", type=float, default=0.0)
    parser.add_argument("--jitter-us", type=float, default=0.0)
    parser.add_argument("--loss-percent", type=float, default=0.0)
    parser.add_argument("--limit", type=int, default=10000)
    parser.add_argument("--cpus", type=lambda s: {int(c) for c in s.split(",")}, required=True)
    parser.add_argument("--parent", type=int, required=True, help="exit when this process is gone")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    # Dies with the runner, even on SIGKILL: an orphaned relay would keep the namespaces alive.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent:
        return 1  # the parent died before the line above
    os.sched_setaffinity(0, args.cpus)
    # Real-time priority, as netem has in the kernel (it runs in softirq): a busy CPU would
    # otherwise hold each release back by a scheduler slice (ms). The kernel's RT throttling
    # still leaves others 5% of a CPU the relay saturates.
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_RT_PRIORITY))
        realtime = True
    except PermissionError:
        realtime = False
    # The default 50 us timer slack would add up to 50 us to every release (a lan RTT is 500 us).
    _prctl(_PR_SET_TIMERSLACK, 1)
    signal.signal(signal.SIGTERM, _stop)
    fds = (open_tun(args.namespaces[0], args.device), open_tun(args.namespaces[1], args.device))
    config = RelayConfig(
        args.delay_us / 1e6, args.jitter_us / 1e6, args.loss_percent / 100, args.limit, args.seed
    )
    relay = Relay(fds, config)
    signal.signal(signal.SIGUSR1, lambda signum, frame: _emit(relay.stats("stats")))
    _emit({"event": "ready", "pid": os.getpid(), "cpus": sorted(args.cpus), "realtime": realtime})
    with contextlib.suppress(_Stop):
        relay.run()
    _emit(relay.stats("stopped"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
