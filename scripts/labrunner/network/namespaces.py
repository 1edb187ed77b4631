"""Network namespace pairs joined by a veth link: create, enter, remove, and clean up after a killed run."""

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

NAMESPACE_PREFIX = "protolab-"
NEED_ROOT = "network scenarios need root (CAP_NET_ADMIN)"
NEED_IPROUTE2 = "network scenarios need iproute2 (`ip`, `tc`): apt-get install iproute2"
# RFC 2544's benchmarking range: never one of the host's networks.
BENCHMARK_RANGE = IPv4Network("198.18.0.0/15")
DEFAULT_SUBNET = IPv4Network("198.18.0.0/30")
# Each end lives in its own namespace, so these fixed names (<= 15 characters, the kernel's
# limit) never collide between pairs, however long the run and scenario ids are.
SERVICE_DEVICE = "plab-svc"
CLIENT_DEVICE = "plab-k6"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts the namespaces it names
_CAP_NET_ADMIN = 12  # linux/capability.h
_CLONE_NEWNET = 0x40000000  # linux/sched.h
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_MAX = 200  # a file name under /run/netns (255), with room to spare
_libc = ctypes.CDLL(None, use_errno=True)  # os.setns arrives in Python 3.12


class NetworkError(RuntimeError):
    """A namespace, link or emulator could not be set up; the message says what to do."""


@dataclass(frozen=True)
class Side:
    """One end of the link: its namespace, its veth device and its address."""

    namespace: str
    device: str
    interface: IPv4Interface

    @property
    def address(self) -> str:
        return str(self.interface.ip)


@dataclass(frozen=True)
class Link:
    """The service's namespace and the client's (k6's), joined by a veth pair."""

    service: Side
    client: Side

    @property
    def namespaces(self) -> tuple[str, str]:
        return self.service.namespace, self.client.namespace


def require_net_admin() -> None:
    """Raise NetworkError unless this process may create namespaces and links."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise NetworkError(NEED_IPROUTE2)
    status = dict(line.partition(":")[::2] for line in Path("/proc/self/status").read_text().splitlines())
    effective = int(status["CapEff"].strip(), 16)
    # `ip netns add` also mounts (CAP_SYS_ADMIN); root has both, and root is what we ask for.
    if not effective >> _CAP_NET_ADMIN & 1 or os.geteuid() != 0:
        raise NetworkError(NEED_ROOT)


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an iproute2 command (no shell); failures become NetworkError with its own words."""
    completed = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and completed.returncode != 0:
        said = completed.stderr.strip() or completed.stdout.strip()
        if "Operation not permitted" in said or "Permission denied" in said:
            raise NetworkError(f"{NEED_ROOT}: `{' '.join(argv)}` said: {said}")
        raise NetworkError(f"`{' '.join(argv)}` failed: {said}")
    return completed


def namespace_names(run_id: str, scenario_id: str, prefix: str = NAMESPACE_PREFIX) -> tuple[str, str]:
    """The service's and the client's namespace: <prefix><run>-<scenario>-svc / -k6."""
    stem = f"{prefix}{_UNSAFE.sub('-', run_id)}-{_UNSAFE.sub('-', scenario_id)}"
    if len(stem) + len("-svc") > _NAME_MAX:
        raise NetworkError(f"namespace name {stem!r} is too long (at most {_NAME_MAX} characters)")
    return f"{stem}-svc", f"{stem}-k6"


def plan_link(
    run_id: str, scenario_id: str, subnet: IPv4Network = DEFAULT_SUBNET, prefix: str = NAMESPACE_PREFIX
) -> Link:
    """The names and addresses of a scenario's link: the service gets the subnet's first address."""
    if subnet.prefixlen != 30 or not subnet.subnet_of(BENCHMARK_RANGE):
        raise NetworkError(f"subnet {subnet} must be a /30 inside {BENCHMARK_RANGE}")
    service_ns, client_ns = namespace_names(run_id, scenario_id, prefix)
    first, second = subnet.hosts()
    return Link(
        Side(service_ns, SERVICE_DEVICE, IPv4Interface(f"{first}/30")),
        Side(client_ns, CLIENT_DEVICE, IPv4Interface(f"{second}/30")),
    )


def create_link(link: Link) -> Link:
    """Create the planned namespaces, loopback up in each, joined by an addressed veth pair.

    On any failure what was created is removed again.
    """
    require_net_admin()
    service_ns, client_ns = link.namespaces
    try:
        for side in (link.service, link.client):
            run(["ip", "netns", "add", side.namespace])
        # Created inside the service's namespace with its peer moved at once: never on the host.
        veth = ["link", "add", SERVICE_DEVICE, "type", "veth", "peer", "name", CLIENT_DEVICE]
        run(["ip", "-n", service_ns, *veth, "netns", client_ns])
        for side in (link.service, link.client):
            run(["ip", "-n", side.namespace, "addr", "add", str(side.interface), "dev", side.device])
            # One MTU-sized packet per skb, as on a wire: an emulator would otherwise delay or
            # drop a 64 KB TCP super-packet as one.
            run(["ip", "-n", side.namespace, "link", "set", side.device, "gso_max_segs", "1", "up"])
            run(["ip", "-n", side.namespace, "link", "set", "lo", "up"])
    except BaseException:
        remove_link(link)
        raise
    return link


HOST_DEVICE = "plab-host"  # on the host; its peer lives in the service's namespace
HOST_PEER_DEVICE = "plab-hsvc"
HOST_SUBNET = IPv4Network("198.18.1.0/30")


def add_host_access(link: Link, subnet: IPv4Network = HOST_SUBNET) -> None:
    """A veth pair from the host into the service's namespace, and a host route to the service.

    The runner's health check, its verification and Prometheus then reach
    link.service.address from the host, past the emulated link (k6's side is untouched).
    The pair, and with it the route, goes when the service's namespace is deleted.
    """
    if subnet.prefixlen != 30 or not subnet.subnet_of(BENCHMARK_RANGE):
        raise NetworkError(f"subnet {subnet} must be a /30 inside {BENCHMARK_RANGE}")
    host, peer = (IPv4Interface(f"{address}/30") for address in subnet.hosts())
    namespace = link.service.namespace
    # An earlier scenario's pair can outlive its namespace's deletion (see remove_link).
    _delete_host_device()
    # Made on the host with its peer moved at once; a killed run's pair went with its namespace.
    veth = ["link", "add", HOST_DEVICE, "type", "veth", "peer", "name", HOST_PEER_DEVICE]
    run(["ip", *veth, "netns", namespace])
    run(["ip", "addr", "add", str(host), "dev", HOST_DEVICE])
    run(["ip", "link", "set", HOST_DEVICE, "up"])
    run(["ip", "-n", namespace, "addr", "add", str(peer), "dev", HOST_PEER_DEVICE])
    run(["ip", "-n", namespace, "link", "set", HOST_PEER_DEVICE, "up"])
    run(["ip", "route", "replace", f"{link.service.address}/32", "via", str(peer.ip), "dev", HOST_DEVICE])
    # Replies to any host-side source (a container's Prometheus) go back the same way; the
    # client's address stays on the emulated link, its routes being more specific.
    run(["ip", "-n", namespace, "route", "add", "default", "via", str(host.ip), "dev", HOST_PEER_DEVICE])


def remove_link(link: Link) -> None:
    """Delete the host's veth into the service's namespace, then both namespaces (and with them
    the link's veth pair); already gone is fine.

    The host's veth goes first and by name: a deleted namespace lives on, with its devices, while
    a socket inside still holds it (after a lossy scenario, connections that retransmit into a
    link that no longer exists, for minutes), and the next scenario's host veth takes that name.
    """
    _delete_host_device()
    for namespace in link.namespaces:
        _delete_namespace(namespace)


def _delete_host_device() -> None:
    run(["ip", "link", "del", HOST_DEVICE], check=False)


def list_namespaces(prefix: str = NAMESPACE_PREFIX) -> list[str]:
    """Named network namespaces whose name starts with `prefix`."""
    out = run(["ip", "-j", "netns", "list"]).stdout.strip()
    return sorted(entry["name"] for entry in json.loads(out or "[]") if entry["name"].startswith(prefix))


def remove_leftovers(prefix: str = NAMESPACE_PREFIX, keep_in_use: bool = False) -> list[str]:
    """Delete every namespace a killed run left (a run starts with this); returns their names.

    Only one run per host may use a prefix at a time, as for the docker backend's containers,
    unless `keep_in_use`: then a namespace a live process holds open (see hold()) is another
    run's and stays. Processes left inside a leftover (a service orphaned by a SIGKILL of its
    runner) are killed first: they would keep the namespace, and its veths, alive.
    """
    if not prefix.startswith(NAMESPACE_PREFIX):
        raise ValueError(f"prefix {prefix!r} must start with {NAMESPACE_PREFIX!r}: only the lab's own")
    if not NETNS_DIR.is_dir():
        return []  # no named namespace was ever created on this boot
    require_net_admin()
    leftovers = list_namespaces(prefix)
    if keep_in_use:
        held = _held_namespaces()
        leftovers = [ns for ns in leftovers if _inode(ns) not in held]
    for namespace in leftovers:
        _kill_inside(namespace)
        _delete_namespace(namespace)
    return leftovers


def _kill_inside(namespace: str) -> None:
    for pid in run(["ip", "netns", "pids", namespace], check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def hold(link: Link) -> list[int]:
    """Open both namespaces' files: while these descriptors are open, remove_leftovers(keep_in_use=True)
    in another run leaves the link alone. Close them (os.close) before removing the link."""
    return [os.open(NETNS_DIR / namespace, os.O_RDONLY) for namespace in link.namespaces]


def _inode(namespace: str) -> int | None:
    try:
        return (NETNS_DIR / namespace).stat().st_ino
    except OSError:
        return None


def _held_namespaces() -> set[int]:
    """Inodes of the network namespaces live processes hold open (not those they only run in)."""
    held: set[int] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        for path in proc.glob("fd/*"):
            try:
                target = os.readlink(path)
            except OSError:
                continue  # gone meanwhile, or not ours to read
            if target.startswith("net:["):  # a namespace fd opened from /proc
                held.add(int(target[5:-1]))
            elif target.startswith(f"{NETNS_DIR}/") and (inode := _inode(target[len(f"{NETNS_DIR}/") :])):
                held.add(inode)  # its file under /run/netns held open (hold())
    return held


def exec_prefix(namespace: str) -> list[str]:
    """The argv prefix that runs a command inside `namespace`: exec_prefix(ns) + ["k6", ...]."""
    return ["ip", "netns", "exec", namespace]


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Move the calling thread into `namespace` for the block: sockets made there stay there.

    Only the network namespace changes, and only for this thread; it moves back on exit.
    """
    with open("/proc/thread-self/ns/net") as home, open(NETNS_DIR / namespace) as target:
        _setns(target.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise NetworkError(f"setns failed: {os.strerror(errno)}")


def _delete_namespace(namespace: str) -> None:
    completed = run(["ip", "netns", "del", namespace], check=False)
    if completed.returncode != 0 and "No such file" not in completed.stderr:
        raise NetworkError(f"`ip netns del {namespace}` failed: {completed.stderr.strip()}")
