"""A network scenario on the local backend: its namespaces, the link between them, the emulator on
it and the host's access, verified against the profile; removed again at the scenario's end; and
what the result records of them."""

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from labrunner.backends.base import ScenarioFailed
from labrunner.model.scenario import Scenario
from labrunner.network.emulators import Emulator, UserspaceEmulator, choose_emulator
from labrunner.network.link_checks import LinkMeasurement, LinkVerificationError, verify
from labrunner.network.namespaces import (
    NAMESPACE_PREFIX,
    Link,
    NetworkError,
    add_host_access,
    create_link,
    hold,
    plan_link,
    remove_leftovers,
    remove_link,
    require_net_admin,
)

HOST = "127.0.0.1"  # the service's and k6's address without an emulated link
# Runs' namespaces: the leftovers a run removes are these, never a test's (protolab-t<pid>-).
RUN_NAMESPACE_PREFIX = f"{NAMESPACE_PREFIX}run-"


@dataclass
class Network:
    """A network scenario's link and the emulator on it, until the scenario ends."""

    link: Link
    held: list[int]  # open namespace files: other runs' remove_leftovers() leave the link alone
    emulator: Emulator | None = None  # set once it is applied, so teardown knows to remove it
    measurement: LinkMeasurement | None = None


def remove_run_leftovers() -> None:
    """What a killed run left (namespaces, their veths, orphaned services); a live run holds its
    namespaces open, so they stay."""
    with contextlib.suppress(NetworkError):  # no iproute2: network scenarios say so later
        remove_leftovers(RUN_NAMESPACE_PREFIX, keep_in_use=True)


def create_network(run_id: str, scenario: Scenario, relay_cpus: tuple[int, ...], notes: list[str]) -> Network:
    """The scenario's namespaces, link, emulator and host access, verified against its profile.

    Any failure is the scenario's, in phase "network"; what was made is removed again.
    """
    profile = scenario.network
    try:
        require_net_admin()
        link = create_link(plan_link(run_id, scenario.id, prefix=RUN_NAMESPACE_PREFIX))
    except NetworkError as exc:
        raise ScenarioFailed("network", str(exc)) from exc
    try:
        network = Network(link, hold(link))
    except BaseException:
        remove_link(link)
        raise
    try:
        add_host_access(network.link)
        emulator = choose_emulator(relay_cpus)
        emulator.apply(network.link, profile)
        network.emulator = emulator
        # QUIC's link is UDP: its RTT is verified too, beside ICMP's (network.link_checks).
        network.measurement = verify(network.link, profile, udp=scenario.target.protocol == "http3")
    except (NetworkError, LinkVerificationError) as exc:
        remove_network(network)
        raise ScenarioFailed("network", str(exc)) from exc
    except BaseException:
        remove_network(network)
        raise
    if network.emulator is not None and network.emulator.name == "userspace":
        notes.append(
            f"network {profile.name}: the userspace link emulator shares k6's CPUs "
            f"{','.join(map(str, relay_cpus))}"
        )
    return network


def remove_network(network: Network) -> None:
    """Emulator off, then the namespaces (and with them the veths, TUN devices and host route)."""
    try:
        if network.emulator is not None:
            network.emulator.remove(network.link)
    finally:
        while network.held:
            os.close(network.held.pop())
        remove_link(network.link)


def network_path(network: Network | None) -> str:
    if network is None:
        return f"loopback {HOST}: k6 process to service process"
    emulator = network.emulator.name if network.emulator else "no emulator"
    return f"veth pair between network namespaces ({emulator}): k6 process to service process"


def relay_cpu(network: Network | None) -> float | None:
    """The userspace relay's CPU seconds so far; None for netem (kernel time) or a dead relay."""
    if network is None or network.emulator is None:
        return None
    try:
        usage = network.emulator.usage(network.link)
    except NetworkError:
        return None
    return None if usage is None else usage.cpu_s


def network_record(network: Network | None) -> dict[str, Any] | None:
    """What the result records of the link: the emulator and what verification measured."""
    if network is None:
        return None
    measurement = network.measurement
    relay = network.emulator if isinstance(network.emulator, UserspaceEmulator) else None
    return {
        "emulator": network.emulator.name if network.emulator else None,
        # Where the userspace relay runs (k6's CPUs); its CPU time is in the host section.
        "relay_cpus": list(relay.cpus) if relay else None,
        "service_address": network.link.service.address,
        "client_address": network.link.client.address,
        "measured_rtt_s": measurement.rtt_s if measurement else None,
        "measured_rate_bps": measurement.rate_bps if measurement else None,
        "measured_udp_rtt_s": measurement.udp_rtt_s if measurement else None,
    }
