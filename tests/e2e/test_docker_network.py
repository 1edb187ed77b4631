"""Network conditions under a real engine: tc from a helper in the service's namespace, never NET_ADMIN
for the service; a kernel without netem fails the scenario saying what it needs.
"""

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.docker import network_helper as docker_network_helper
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides

from tests.e2e.docker_lab import (
    EXIT_FAILED,
    EXIT_OK,
    QUIET,
    EngineEvents,
    managed_containers,
    quick_benchmark,
    results,
    run_cli,
    start_run,
    unique_run_id,
)
from tests.support import ROOT, seed_keeping_matrix_order

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


# --- Network conditions: tc from a helper in the service's namespace, never NET_ADMIN for the service


def kernel_has_netem() -> bool:
    """Whether the engine's kernel takes a netem qdisc (asked in a throwaway namespace)."""
    tried = run_cli(
        "docker", "run", "--rm", "--network", "none", "--cap-drop", "ALL", "--cap-add", "NET_ADMIN",
        docker_network_helper.NETWORK_HELPER_IMAGE, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
        "delay", "1ms", check=False,
    )  # fmt: skip
    assert tried.returncode == 0 or docker_network_helper.NO_NETEM in tried.stderr, tried.stderr
    return tried.returncode == 0


class QdiscWatch:
    """`tc qdisc show` inside a service container's network namespace (from a helper without any
    capability) until it shows the emulation or the container is gone: what the service's packets pass."""

    def __init__(self, container_id: str) -> None:
        self.seen = ""
        self._id = container_id
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 60
        # Until the ifb device has its qdisc too: the device exists (with the default pfifo_fast)
        # a moment before the helper's last command puts the emulation on it.
        while time.monotonic() < deadline and not re.search(r"qdisc (tbf|netem) \S+ dev plab-ifb", self.seen):
            shown = run_cli(
                "docker", "run", "--rm", "--network", f"container:{self._id}", "--cap-drop", "ALL",
                docker_network_helper.NETWORK_HELPER_IMAGE, "tc", "qdisc", "show", check=False, timeout=30,
            )  # fmt: skip
            if shown.returncode != 0 and "No such container" in shown.stderr:
                return
            self.seen = shown.stdout if "qdisc tbf" in shown.stdout else self.seen
            time.sleep(0.5)

    def join(self) -> str:
        self._thread.join(timeout=90)
        return self.seen


def test_a_rate_only_network_is_emulated_without_net_admin_for_the_service_and_netem_says_what_it_needs(
    lab: list[str], tmp_path: Path
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((ROOT / "matrix.toml").read_text() + '\n[networks.narrow-rate]\nrate = "10mbit"\n')
    out = tmp_path / unique_run_id("network")
    quick_benchmark(out)
    wan, narrow = "aiohttp-h1.small.c100.closed.wan.r1", "aiohttp-h1.small.c100.closed.narrow-rate.r1"
    services: dict[str, dict[str, Any]] = {}  # scenario -> `docker inspect` of its service container
    watches: dict[str, QdiscWatch] = {}

    def on_start(event: dict[str, Any]) -> None:
        labels = event["Actor"]["Attributes"]
        if labels.get("protolab.role") != "service" or labels.get("protolab.scenario") != narrow:
            return
        found = run_cli("docker", "inspect", event["Actor"]["ID"], check=False)
        if found.returncode == 0:
            services[labels["protolab.scenario"]] = json.loads(found.stdout)[0]
        watches[labels["protolab.scenario"]] = QdiscWatch(event["Actor"]["ID"])

    events = EngineEvents(out.name, on_start=on_start)
    # wan first (the matrix's order), so the run is seen to go on after its failure.
    networks = Overrides(targets=("aiohttp-h1",), networks=("wan", "narrow-rate"))
    in_order = seed_keeping_matrix_order(expand(load_matrix(matrix), "docker", "ci", networks))
    run = start_run(
        out, "--matrix", str(matrix), "--preset", "ci", "--target", "aiohttp-h1",
        "--network", "wan,narrow-rate", "--duration", "3s", "--warmup", "1s", "--repeats", "1",
        "--seed", in_order, *QUIET,
    )  # fmt: skip
    try:
        exit_code = run.wait(timeout=400)
    finally:
        events.close()
    found = results(out)
    assert set(found) == {wan, narrow}, run.output()

    # The rate-only profile: tbf on the service's interface (egress) and on its ifb (ingress),
    # put there by a helper; the link measured within 10% before k6 measured through it.
    result = found[narrow]
    assert result["status"] == "ok", result["failure"]
    network = result["network"]
    assert (network["profile"], network["emulator"]) == ("narrow-rate", "tbf")
    assert abs(network["measured_rate_bps"] - 10e6) <= 0.1 * 10e6, network
    assert 0 < network["measured_rtt_s"] < 0.00025, network  # no delay: within the RTT floor
    container = services[narrow]
    assert network["service_address"] == container["NetworkSettings"]["Networks"]["protolab"]["IPAddress"]
    # The service itself never had NET_ADMIN: no capability added, all dropped.
    assert not container["HostConfig"]["CapAdd"], container["HostConfig"]["CapAdd"]
    assert container["HostConfig"]["CapDrop"] == ["ALL"]
    qdiscs = watches[narrow].join()
    assert re.search(r"qdisc tbf \S+ dev eth0 root .*rate 10Mbit", qdiscs), qdiscs
    assert re.search(r"qdisc tbf \S+ dev plab-ifb root .*rate 10Mbit", qdiscs), qdiscs
    assert re.search(r"qdisc ingress ffff: dev eth0", qdiscs), qdiscs
    # k6's own traffic went through the link: the responses' bytes fit in 10 Mbit/s.
    received_bps = result["k6"]["metrics"]["data_received_bytes_per_second"] * 8
    assert 5e6 < received_bps <= 10e6, received_bps
    helpers = {name.removeprefix(container["Name"].lstrip("/")) for _, name in events.actions("create")}
    assert {"-tc", "-link-serve", "-link-probe"} <= helpers, helpers

    # The netem profile: on a kernel without sch_netem (this CI machine's) it fails saying so,
    # and the next scenario still ran; where netem exists it is verified like the rate.
    if kernel_has_netem():
        assert found[wan]["status"] == "ok", found[wan]["failure"]
        assert found[wan]["network"]["emulator"] == "netem"
        assert abs(found[wan]["network"]["measured_rtt_s"] - 0.050) <= 0.005, found[wan]["network"]
        assert exit_code == EXIT_OK, run.output()
    else:
        failure = found[wan]["failure"]
        assert failure["phase"] == "network", failure
        assert failure["message"] == docker_network_helper.no_netem_message(
            load_matrix(matrix).networks["wan"]
        )
        assert "sch_netem" in failure["message"] and "--backend local" in failure["message"]
        assert found[wan]["finished_at"] <= result["started_at"]  # the run went on after it
        assert exit_code == EXIT_FAILED, run.output()
        assert "FAILED in network: network wan: the Docker engine's kernel has no netem" in run.output()
    assert managed_containers() == []
    created = {name for _, name in events.actions("create")}
    assert created == {name for _, name in events.actions("destroy")}, events.actions()
