"""Two ways to impose a profile on a link (tc netem, or the lab's userspace relay), and the choice."""

import contextlib
import functools
import json
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from labrunner.network.namespaces import NAMESPACE_PREFIX, Link, NetworkError, require_net_admin, run
from labrunner.network.profiles import NetworkProfile

# Packets a direction may hold while they wait out their delay (netem's default is 1000, which
# at a 25 ms delay caps a link at 40,000 packets/s, below what the lab's services send).
QUEUE_LIMIT = 10000
MTU_FRAME = 1514  # bytes tbf counts for a full packet on the veth (IP 1500 + Ethernet 14)
TUN_DEVICE = "plab-emu"
# The TUN routes win over the veth's /30 by being /32s; the guard stays behind if the relay dies,
# so traffic then fails loudly instead of silently taking the unemulated veth.
_TUN_METRIC = "10"
_GUARD_METRIC = "1000"
_READY_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RelayUsage:
    """What the userspace relay cost and did (counters since it started)."""

    cpu_s: float
    runqueue_wait_s: float  # runnable but not running: other work on its CPUs (interference)
    received: int
    forwarded: int
    lost: int
    overflow: int
    late_mean_us: float  # how late packets left against their due time: the timer's error
    late_max_us: float


class Emulator(Protocol):
    """Imposes a profile on both directions of a link, and takes it off again."""

    name: str  # what a result records: "netem" or "userspace"

    def apply(self, link: Link, profile: NetworkProfile) -> None: ...

    def usage(self, link: Link) -> RelayUsage | None:
        """The emulator's own cost so far, when it runs as a process (netem's is in the kernel)."""
        ...

    def remove(self, link: Link) -> RelayUsage | None:
        """Take the emulation off; returns the final usage, as usage() does."""
        ...


def tbf_args(profile: NetworkProfile) -> list[str]:
    """tbf's rate, burst and queue for the profile's rate (per direction).

    The burst is 1 ms of traffic (two full packets at least): larger bursts would let short
    transfers beat the rate. The queue holds a bandwidth-delay product (64 KiB at least), so one
    TCP flow can keep the link busy, as a router's buffer does.
    """
    assert profile.rate_bps is not None
    bytes_per_s = profile.rate_bps / 8
    burst = max(2 * MTU_FRAME, math.ceil(bytes_per_s / 1000))
    queue = max(64 * 1024, math.ceil(bytes_per_s * profile.rtt_s))
    return ["tbf", "rate", f"{profile.rate_bps}bit", "burst", str(burst), "limit", str(burst + queue)]


def netem_args(profile: NetworkProfile) -> list[str]:
    """netem's delay, jitter and loss for the profile (per direction), with the lab's queue limit."""
    netem = ["netem", "limit", str(QUEUE_LIMIT), "delay", f"{round(profile.delay_s * 1e6)}us"]
    if profile.jitter_s:
        netem.append(f"{round(profile.jitter_s * 1e6)}us")
    if profile.loss_percent:
        netem += ["loss", f"{profile.loss_percent:g}%"]
    return netem


def netem_qdisc_commands(tc: Sequence[str], device: str, profile: NetworkProfile) -> list[list[str]]:
    """The tc commands that put the profile on `device`'s egress: netem, with tbf under it for a rate.

    `tc` is the command's prefix (e.g. `tc -n <namespace>`); the local backend's NetemEmulator and
    the docker backend's helper container both use these.
    """
    qdisc = [*tc, "qdisc", "replace", "dev", device]
    commands = [[*qdisc, "root", "handle", "1:", *netem_args(profile)]]
    if profile.rate_bps:
        # Under netem: packets leave its delay line into the rate limiter.
        commands.append([*qdisc, "parent", "1:1", "handle", "10:", *tbf_args(profile)])
    return commands


def tbf_qdisc_commands(tc: Sequence[str], device: str, profile: NetworkProfile) -> list[list[str]]:
    """The tc command that limits `device`'s egress to the profile's rate with tbf alone (no netem)."""
    return [[*tc, "qdisc", "replace", "dev", device, "root", "handle", "10:", *tbf_args(profile)]]


class NetemEmulator:
    """tc netem on both veth ends (delay, jitter, loss), with tbf under it for a rate."""

    name = "netem"

    def commands(self, link: Link, profile: NetworkProfile) -> list[list[str]]:
        """The exact tc commands apply() runs."""
        commands = []
        for side in (link.service, link.client):
            commands += netem_qdisc_commands(["tc", "-n", side.namespace], side.device, profile)
        return commands

    def apply(self, link: Link, profile: NetworkProfile) -> None:
        _require_emulated(profile)
        try:
            for command in self.commands(link, profile):
                run(command)
        except NetworkError:
            self.remove(link)
            raise

    def usage(self, link: Link) -> None:
        return None  # netem works in the senders' softirq context: counted as theirs

    def remove(self, link: Link) -> None:
        """Back to a plain veth; a namespace already gone is fine."""
        for side in (link.service, link.client):
            run(["tc", "-n", side.namespace, "qdisc", "del", "dev", side.device, "root"], check=False)


class UserspaceEmulator:
    """A relay process between a TUN device in each namespace, for kernels without netem.

    In each namespace a /32 route sends the peer's address into the TUN device instead of the
    veth; the relay (pinned to `cpus`) delays and drops each packet as netem would; tbf on each
    TUN device limits the rate.
    """

    name = "userspace"

    def __init__(self, cpus: Sequence[int]) -> None:
        if not cpus:
            raise ValueError("the userspace emulator needs at least one CPU to run on")
        self.cpus = tuple(cpus)
        self._relays: dict[Link, subprocess.Popen[str]] = {}

    def relay_argv(self, link: Link, profile: NetworkProfile) -> list[str]:
        """The relay's command line: the profile's one-way values, its CPUs, and who it dies with."""
        options = {
            "--device": TUN_DEVICE,
            "--delay-us": f"{profile.delay_s * 1e6:g}",
            "--jitter-us": f"{profile.jitter_s * 1e6:g}",
            "--loss-percent": f"{profile.loss_percent:g}",
            "--limit": str(QUEUE_LIMIT),
            "--cpus": ",".join(map(str, self.cpus)),
            "--parent": str(os.getpid()),
        }
        argv = [sys.executable, "-m", "labrunner.network.relay", "--namespaces", *link.namespaces]
        return argv + [part for option in options.items() for part in option]

    def route_commands(self, link: Link, profile: NetworkProfile) -> list[list[str]]:
        """The ip and tc commands that send each side's traffic to its peer through the relay."""
        commands = []
        for side, peer in ((link.service, link.client), (link.client, link.service)):
            ip = ["ip", "-n", side.namespace]
            to_peer = f"{peer.address}/32"
            commands += [
                [*ip, "link", "set", TUN_DEVICE, "up"],
                [*ip, "route", "add", to_peer, "dev", TUN_DEVICE, "src", side.address, "metric", _TUN_METRIC],
                [*ip, "route", "add", "unreachable", to_peer, "metric", _GUARD_METRIC],
            ]
            if profile.rate_bps:
                tc = ["tc", "-n", side.namespace, "qdisc", "replace", "dev", TUN_DEVICE, "root"]
                commands.append([*tc, *tbf_args(profile)])
        return commands

    def apply(self, link: Link, profile: NetworkProfile) -> None:
        _require_emulated(profile)
        if link in self._relays:
            raise NetworkError(f"{link.namespaces} already has an emulator")
        relay = subprocess.Popen(
            self.relay_argv(link, profile), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._relays[link] = relay
        try:
            _expect(relay, "ready")
            for command in self.route_commands(link, profile):
                run(command)
        except BaseException:
            self.remove(link)
            raise

    def relay_pid(self, link: Link) -> int:
        """The relay process of `link` (to watch it, or to report it as interference)."""
        return self._relays[link].pid

    def usage(self, link: Link) -> RelayUsage:
        """The relay's counters now (SIGUSR1 makes it print them)."""
        relay = self._relays[link]
        relay.send_signal(signal.SIGUSR1)
        return _usage(_expect(relay, "stats"))

    def remove(self, link: Link) -> RelayUsage | None:
        """Stop the relay (its TUN devices and routes go with it), then drop the guard routes.

        Returns the relay's final counters, or None when it had died already.
        """
        relay = self._relays.pop(link, None)
        final = None
        if relay is not None:
            if relay.poll() is None:
                relay.terminate()
                with contextlib.suppress(NetworkError):
                    final = _usage(_expect(relay, "stopped"))
            try:
                relay.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
            for stream in (relay.stdout, relay.stderr):
                if stream is not None:
                    stream.close()
        for side, peer in ((link.service, link.client), (link.client, link.service)):
            guard = ["route", "del", "unreachable", f"{peer.address}/32", "metric", _GUARD_METRIC]
            run(["ip", "-n", side.namespace, *guard], check=False)  # gone with its namespace: fine
        return final


def choose_emulator(cpus: Sequence[int]) -> Emulator:
    """netem where this kernel has it, else the userspace relay on `cpus`; `.name` says which."""
    if kernel_has_netem():
        return NetemEmulator()
    return UserspaceEmulator(cpus)


@functools.cache
def kernel_has_netem() -> bool:
    """Try a netem qdisc on a veth in a scratch namespace (a module may load on demand)."""
    require_net_admin()
    scratch = f"{NAMESPACE_PREFIX}probe-{os.getpid()}"
    run(["ip", "netns", "add", scratch])
    try:
        run(["ip", "-n", scratch, "link", "add", "plab-probe", "type", "veth", "peer", "name", "plab-peer"])
        tried = run(
            ["tc", "-n", scratch, "qdisc", "add", "dev", "plab-probe", "root", "netem", "delay", "1ms"],
            check=False,
        )
    finally:
        run(["ip", "netns", "del", scratch], check=False)
    if tried.returncode == 0:
        return True
    if "Specified qdisc kind is unknown" in tried.stderr:
        return False
    raise NetworkError(f"probing for netem failed: {tried.stderr.strip()}")


def _require_emulated(profile: NetworkProfile) -> None:
    if not profile.emulated:
        raise ValueError(f"network profile {profile.name!r} sets no condition: it needs no emulator")


def _expect(relay: subprocess.Popen[str], event: str) -> dict[str, object]:
    """The relay's next JSON line, which must be `event`; NetworkError with its stderr otherwise."""
    assert relay.stdout is not None
    ready, _, _ = select.select([relay.stdout], [], [], _READY_TIMEOUT_S)
    line = relay.stdout.readline() if ready else ""
    try:
        message: dict[str, object] = json.loads(line)
    except json.JSONDecodeError:
        message = {}
    if message.get("event") != event:
        if relay.poll() is None:
            relay.kill()
        relay.wait()
        stderr = relay.stderr.read().strip() if relay.stderr else ""
        raise NetworkError(
            f"the userspace link emulator did not report {event!r}: {stderr or line or 'timeout'}"
        )
    return message


def _usage(message: dict[str, object]) -> RelayUsage:
    def number(key: str) -> float:
        value = message[key]
        assert isinstance(value, int | float)
        return value

    return RelayUsage(
        cpu_s=number("cpu_s"),
        runqueue_wait_s=number("runqueue_wait_s"),
        received=int(number("received")),
        forwarded=int(number("forwarded")),
        lost=int(number("lost")),
        overflow=int(number("overflow")),
        late_mean_us=number("late_mean_us"),
        late_max_us=number("late_max_us"),
    )
