"""Network conditions on the docker backend (thin fake client): tc from a helper in the service's
namespace, the link probe on k6's network, the helper image built once per inputs."""

import json
import re
from pathlib import Path

import pytest
from labrunner.backends.base import ScenarioFailed
from labrunner.backends.docker import DockerBackend
from labrunner.backends.docker import network_helper as docker_network_helper
from labrunner.network.profiles import NetworkProfile

from tests.docker_fake import SERVICE_IP, FakeContainer, FakeDocker, network_scenario, scenario, settings
from tests.support import ROOT

pytestmark = pytest.mark.usefixtures("docker_quick_polls")


# --- Network conditions: a tc helper in the service's namespace, a probe on k6's network ----------

PROBE_IP = "172.18.0.10"
NARROW_RATE = NetworkProfile("narrow-rate", rate_bps=10_000_000)  # a rate-only profile: tbf alone


def probe_answers(rtt_s: float, rate_bps: float | None = None) -> tuple[int, bytes]:
    measured = {"event": "measured", "address": PROBE_IP, "rtt_s": [rtt_s] * 21, "rate_bps": rate_bps}
    return 0, json.dumps(measured).encode() + b"\n"


def helpers(fake: FakeDocker) -> dict[str, FakeContainer]:
    return {c.name.removeprefix(fake.created[0].name + "-"): c for c in fake.created if c.role == "network"}


# The exact commands, from the profile: wan is 25 ms +/- 5 ms per direction; narrow-rate 10 Mbit/s.
WAN_NETEM = ["netem", "limit", "10000", "delay", "25000us", "5000us"]
TBF_10MBIT = ["tbf", "rate", "10000000bit", "burst", "3028", "limit", "68564"]
INGRESS_TO_IFB = [
    ["ip", "link", "add", "plab-ifb", "type", "ifb"],
    ["ip", "link", "set", "plab-ifb", "up"],
    ["tc", "qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"],
    ["tc", "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0",
     "0", "action", "mirred", "egress", "redirect", "dev", "plab-ifb"],
]  # fmt: skip


def test_a_netem_profile_is_applied_by_a_helper_with_net_admin_in_the_service_namespace(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(0.0502)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(network_scenario("wan"))
    service = fake.created[0]
    assert service.role == "service" and "cap_add" not in service.params
    assert service.params["cap_drop"] == ["ALL"] and "network_mode" not in service.params
    assert list(helpers(fake)) == ["tc", "link-serve", "link-probe"]  # in this order, after the service
    tc = helpers(fake)["tc"]
    script = "\n".join(
        " ".join(c) for c in docker_network_helper.tc_commands(network_scenario("wan").network)
    )
    assert docker_network_helper.tc_commands(network_scenario("wan").network) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", *WAN_NETEM],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "1:", *WAN_NETEM],
    ]
    assert tc.params == {
        "image": "protolab-network-helper:local",
        "command": ["sh", "-exc", script],
        "name": f"{service.name}-tc",
        "network_mode": f"container:id-{service.name}",  # the service's namespace, not a network
        "user": "0:0",
        "cap_drop": ["ALL"],
        "cap_add": ["NET_ADMIN"],
        "security_opt": ["no-new-privileges:true"],
        "labels": {**service.params["labels"], "protolab.role": "network"},
    }
    probe_file = {
        str(ROOT / "scripts/labrunner/network/docker_probe.py"): {
            "bind": "/probe/docker_probe.py",
            "mode": "ro",
        }
    }
    unprivileged = {"user": "65534:65534", "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"]}
    assert helpers(fake)["link-serve"].params == {
        "image": "protolab-network-helper:local",
        "command": ["python", "/probe/docker_probe.py", "serve", "--port", "5201"],
        "name": f"{service.name}-link-serve",
        "network_mode": f"container:id-{service.name}",
        "labels": {**service.params["labels"], "protolab.role": "network"},
        "volumes": probe_file,
        **unprivileged,
    }
    assert helpers(fake)["link-probe"].params == {
        "image": "protolab-network-helper:local",
        "command": ["python", "/probe/docker_probe.py", "measure", "--host", SERVICE_IP, "--port", "5201",
                    "--samples", "21", "--rate-seconds", "0"],
        "name": f"{service.name}-link-probe",
        "network": "protolab",  # k6's network, on k6's CPUs
        "cpuset_cpus": "0,1,2,3,4,5",
        "labels": {**service.params["labels"], "protolab.role": "network"},
        "volumes": probe_file,
        **unprivileged,
    }  # fmt: skip
    assert set(fake.removed) == {f"{service.name}-{kind}" for kind in ("tc", "link-serve", "link-probe")}
    assert handle.network == {
        "emulator": "netem",
        "service_address": SERVICE_IP,
        "client_address": PROBE_IP,
        "measured_rtt_s": 0.0502,
        "measured_rate_bps": None,
    }


def test_a_rate_only_profile_is_limited_by_tbf_alone_and_its_rate_measured(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(0.0001, 9_700_000.0)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    handle = backend.start_service(network_scenario(NARROW_RATE))
    assert docker_network_helper.tc_commands(NARROW_RATE) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "10:", *TBF_10MBIT],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "10:", *TBF_10MBIT],
    ]
    assert helpers(fake)["tc"].params["command"][-1].splitlines()[0] == (
        "tc qdisc replace dev eth0 root handle 10: tbf rate 10000000bit burst 3028 limit 68564"
    )
    assert helpers(fake)["link-probe"].params["command"][-2:] == ["--rate-seconds", "3"]
    assert handle.network is not None
    assert (handle.network["emulator"], handle.network["measured_rate_bps"]) == ("tbf", 9_700_000.0)


def test_netem_with_a_rate_puts_tbf_under_netem_on_both_devices() -> None:
    narrow = network_scenario("narrow").network
    netem = ["netem", "limit", "10000", "delay", "10000us"]
    tbf = ["tbf", "rate", "10000000bit", "burst", "3028", "limit", "68564"]
    assert docker_network_helper.tc_commands(narrow) == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", *netem],
        ["tc", "qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "10:", *tbf],
        *INGRESS_TO_IFB,
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "root", "handle", "1:", *netem],
        ["tc", "qdisc", "replace", "dev", "plab-ifb", "parent", "1:1", "handle", "10:", *tbf],
    ]


def test_a_kernel_without_netem_fails_the_scenario_naming_sch_netem_and_removes_everything(
    tmp_path: Path, fake: FakeDocker
) -> None:
    fake.helper_outcomes = {"tc": (2, b"+ tc qdisc replace dev eth0 root handle 1: netem ...\n"
                                      b"Error: Specified qdisc kind is unknown.\n")}  # fmt: skip
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(network_scenario("lossy"))
    assert failed.value.phase == "network"
    assert str(failed.value.message) == (
        "network lossy: the Docker engine's kernel has no netem (sch_netem): `tc qdisc ... netem` "
        'answers "Specified qdisc kind is unknown", and this profile\'s delay, jitter or loss need it. '
        "Use an engine whose kernel has sch_netem, or run it with --backend local, whose userspace "
        "link emulator works without netem; rate-only profiles work here (tbf)"
    )
    assert "Specified qdisc kind is unknown" in failed.value.log_tail
    assert list(helpers(fake)) == ["tc"]  # no probe on a link that is not emulated
    assert set(fake.removed) == {c.name for c in fake.created}  # the service too
    # Another tc failure is not blamed on netem.
    fake.helper_outcomes = {"tc": (2, b'Error: Cannot find device "plab-ifb"\n')}
    with pytest.raises(
        ScenarioFailed,
        match=r"^network: network lossy: tc in the service's network namespace failed \(exit 2\)$",
    ):
        backend.start_service(network_scenario("lossy"))


@pytest.mark.parametrize(
    ("network", "rtt_s", "rate_bps", "problem"),
    [
        ("wan", 0.0449, None, "RTT 44.900 ms is more than 5.000 ms off wan's 50.000 ms"),
        ("wan", 0.0001, None, "RTT 0.100 ms is more than 5.000 ms off wan's 50.000 ms"),  # no emulation
        (
            NARROW_RATE,
            0.0001,
            8_900_000.0,
            "rate 8.90 Mbit/s is more than 10% off narrow-rate's 10.00 Mbit/s",
        ),
        (NARROW_RATE, 0.0001, 900_000_000.0, "rate 900.00 Mbit/s is more than 10% off"),  # no limit
    ],
)
def test_a_link_more_than_10_percent_off_its_profile_fails_the_scenario(
    tmp_path: Path,
    fake: FakeDocker,
    network: str | NetworkProfile,
    rtt_s: float,
    rate_bps: float | None,
    problem: str,
) -> None:
    fake.helper_outcomes = {"probe": probe_answers(rtt_s, rate_bps)}
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed) as failed:
        backend.start_service(network_scenario(network))
    assert failed.value.phase == "network"
    assert problem in failed.value.message
    assert set(fake.removed) == {c.name for c in fake.created}


def test_a_probe_that_fails_fails_the_scenario_with_its_error(tmp_path: Path, fake: FakeDocker) -> None:
    fake.helper_outcomes = {
        "probe": (1, b'{"event": "failed", "error": "ConnectionRefusedError: refused"}\n')
    }
    backend = DockerBackend(settings(tmp_path), fake, say=lambda line: None)
    with pytest.raises(ScenarioFailed, match=r"the link probe failed: ConnectionRefusedError: refused"):
        backend.start_service(network_scenario("wan"))


def test_the_helper_image_is_built_once_from_the_labs_base_and_again_when_its_inputs_change(
    tmp_path: Path, fake: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHON_IMAGE", raising=False)
    fake.helper_outcomes = {"probe": probe_answers(0.05)}
    said: list[str] = []
    backend = DockerBackend(settings(tmp_path), fake, say=said.append)
    backend.stop_service(backend.start_service(network_scenario("wan")))
    backend.stop_service(backend.start_service(network_scenario("wan")))
    dockerfile = (ROOT / "network-helper" / "Dockerfile").read_bytes()
    inputs = docker_network_helper.helper_inputs(
        dockerfile, "python:3.11.15-slim-bookworm", ""
    )  # not pulled yet
    assert fake.built == [
        {
            "path": str(ROOT / "network-helper"),
            "tag": "protolab-network-helper:local",
            "buildargs": {},  # the Dockerfile's default base, as compose leaves services/Dockerfile's
            "labels": {"protolab.inputs": inputs},
            "rm": True,
        }
    ]
    assert said == [
        "docker: building protolab-network-helper:local from python:3.11.15-slim-bookworm (iproute2, for tc)"
    ]
    # CI's substitute base (tests/docker/substitutes.env): another base, so another image.
    monkeypatch.setenv("PYTHON_IMAGE", "protolab-test/python:3.11-debian")
    fake.images_present["protolab-test/python:3.11-debian"] = []
    fake.image_ids["protolab-test/python:3.11-debian"] = "sha256:base1"
    backend = DockerBackend(settings(tmp_path), fake, say=said.append)
    backend.start_service(network_scenario("wan"))
    assert fake.built[-1]["buildargs"] == {"PYTHON_IMAGE": "protolab-test/python:3.11-debian"}
    assert fake.built[-1]["labels"] == {
        "protolab.inputs": docker_network_helper.helper_inputs(
            dockerfile, "protolab-test/python:3.11-debian", "sha256:base1"
        )
    }
    assert len(fake.built) == 2
    # Built already from these inputs: a new run does not build again.
    DockerBackend(settings(tmp_path), fake, say=said.append).start_service(network_scenario("wan"))
    assert len(fake.built) == 2
    # The base rebuilt under the same name (CI's build-images.sh): the helper follows.
    fake.image_ids["protolab-test/python:3.11-debian"] = "sha256:base2"
    DockerBackend(settings(tmp_path), fake, say=said.append).start_service(network_scenario("wan"))
    assert len(fake.built) == 3


def test_loopback_starts_no_helper_and_records_no_link(tmp_path: Path, fake: FakeDocker) -> None:
    handle = DockerBackend(settings(tmp_path), fake, say=lambda line: None).start_service(scenario("grpc"))
    assert [c.role for c in fake.created] == ["service"] and fake.built == []
    assert handle.network is None


def test_the_helper_image_has_the_services_base_and_iproute2() -> None:
    helper = (ROOT / "network-helper" / "Dockerfile").read_text()
    services = (ROOT / "services" / "Dockerfile").read_text()
    default = re.compile(r"^ARG PYTHON_IMAGE=(\S+)$", re.MULTILINE)
    helper_default, services_default = default.search(helper), default.search(services)
    assert helper_default is not None and services_default is not None
    assert helper_default[1] == services_default[1] == docker_network_helper.PYTHON_IMAGE
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}$", helper, re.MULTILINE)
    assert re.search(r"apt-get install .*\biproute2\b", helper)
