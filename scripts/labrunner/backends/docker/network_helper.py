"""Network conditions on the docker backend: the network-helper image, tc in the service's
network namespace, and the link probe with its answer parsed."""

import contextlib
import hashlib
import json
import os
import shlex
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
from docker.errors import BuildError, ImageNotFound
from docker.models.containers import Container
from requests.exceptions import RequestException

from labrunner.backends.base import BackendSettings, ScenarioFailed, cpu_list, tail
from labrunner.backends.docker.containers import create_container, docker_errors, remove
from labrunner.backends.docker.names import NETWORK, labels
from labrunner.backends.docker.services import ServiceContainer
from labrunner.network.emulators import netem_qdisc_commands, tbf_qdisc_commands
from labrunner.network.link_checks import LinkMeasurement
from labrunner.network.profiles import NetworkProfile
from labrunner.say import Say

# Network conditions (docs/network.md): a helper container with NET_ADMIN joins the
# service container's network namespace and puts tc qdiscs on its interface; the service never
# gets NET_ADMIN. Both directions are emulated there: egress on eth0, ingress redirected through
# an ifb device whose egress carries the same qdiscs (k6's containers come and go per run, so
# the service's side, which lives for the whole scenario, holds both).
NETWORK_HELPER_IMAGE = "protolab-network-helper:local"
NETWORK_HELPER_DIR = "network-helper"  # its Dockerfile, under the repository root
PYTHON_IMAGE = "python:3.11.15-slim-bookworm"  # services/Dockerfile's default; PYTHON_IMAGE overrides
SERVICE_DEVICE = "eth0"  # the service's one network (the compose network) is its first interface
IFB_DEVICE = "plab-ifb"  # in the service's namespace only: the name cannot clash
NO_NETEM = "Specified qdisc kind is unknown"  # what tc answers where sch_netem is missing
PROBE_FILE = Path("scripts") / "labrunner" / "network" / "docker_probe.py"
PROBE_IN_CONTAINER = "/probe/docker_probe.py"
PROBE_PORT = 5201  # in the service's namespace, beside the service's own ports
PROBE_RTT_SAMPLES = 21
PROBE_RATE_SECONDS = 3.0
_HELPER_TIMEOUT_S = 60
INPUTS_LABEL = "protolab.inputs"  # the network helper image's: a hash of what it was built from


def helper_inputs(dockerfile: bytes, base: str, base_id: str) -> str:
    """What the network helper image is built from (its Dockerfile, the base's name and, when the
    engine has it, the base's image id); a different answer means it must be rebuilt."""
    return hashlib.sha256(b"\0".join([dockerfile, base.encode(), base_id.encode()])).hexdigest()[:16]


def emulator_name(profile: NetworkProfile) -> str:
    """netem for delay, jitter or loss; tbf alone for a rate-only profile (every kernel has tbf)."""
    return "netem" if profile.delay_s or profile.jitter_s or profile.loss_percent else "tbf"


def tc_commands(profile: NetworkProfile) -> list[list[str]]:
    """The commands the tc helper runs in the service's namespace, in order.

    The egress qdisc comes first, so that a kernel without netem stops the helper before it
    changes anything. The ingress side: every packet arriving on eth0 is redirected to an ifb
    device, whose egress has the same qdiscs, so k6's requests see the profile too.
    """
    qdiscs = netem_qdisc_commands if emulator_name(profile) == "netem" else tbf_qdisc_commands
    ifb = IFB_DEVICE
    return [
        *qdiscs(["tc"], SERVICE_DEVICE, profile),
        ["ip", "link", "add", ifb, "type", "ifb"],
        ["ip", "link", "set", ifb, "up"],
        ["tc", "qdisc", "add", "dev", SERVICE_DEVICE, "handle", "ffff:", "ingress"],
        # Every packet arriving on eth0 (any protocol) leaves through the ifb device instead.
        shlex.split(
            f"tc filter add dev {SERVICE_DEVICE} parent ffff: protocol all u32 match u32 0 0 "
            f"action mirred egress redirect dev {ifb}"
        ),
        *qdiscs(["tc"], ifb, profile),
    ]


def tc_helper_params(profile: NetworkProfile, service: Container) -> dict[str, Any]:
    """The tc helper: tc_commands as one `sh -e` script in the service's network namespace, as root
    with NET_ADMIN as its only capability."""
    script = "\n".join(shlex.join(command) for command in tc_commands(profile))
    return {
        "command": ["sh", "-exc", script],  # -x: its log shows which command failed
        "network_mode": f"container:{service.id}",
        "user": "0:0",
        "cap_drop": ["ALL"],
        "cap_add": ["NET_ADMIN"],
        "security_opt": ["no-new-privileges:true"],
    }


def _probe_params(root: Path) -> dict[str, Any]:
    return {
        "user": "65534:65534",  # nobody: the probe needs no privilege
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "volumes": {str(root / PROBE_FILE): {"bind": PROBE_IN_CONTAINER, "mode": "ro"}},
    }


def probe_serve_params(root: Path, service: Container) -> dict[str, Any]:
    """The probe's peer, in the service's network namespace: RTT handshakes and the bulk sender."""
    return {
        "command": ["python", PROBE_IN_CONTAINER, "serve", "--port", str(PROBE_PORT)],
        "network_mode": f"container:{service.id}",
        **_probe_params(root),
    }


def probe_measure_params(
    root: Path, service_ip: str, profile: NetworkProfile, cpus: tuple[int, ...]
) -> dict[str, Any]:
    """The probe on k6's network and CPUs; the bulk transfer only for a profile with a rate."""
    rate_seconds = PROBE_RATE_SECONDS if profile.rate_bps else 0.0
    return {
        "command": [
            "python",
            PROBE_IN_CONTAINER,
            "measure",
            "--host",
            service_ip,
            "--port",
            str(PROBE_PORT),
            "--samples",
            str(PROBE_RTT_SAMPLES),
            "--rate-seconds",
            f"{rate_seconds:g}",
        ],
        "network": NETWORK,
        "cpuset_cpus": cpu_list(cpus),
        **_probe_params(root),
    }


def no_netem_message(profile: NetworkProfile) -> str:
    return (
        f"network {profile.name}: the Docker engine's kernel has no netem (sch_netem): "
        f'`tc qdisc ... netem` answers "{NO_NETEM}", and this profile\'s delay, jitter or loss '
        "need it. Use an engine whose kernel has sch_netem, or run it with --backend local, whose "
        "userspace link emulator works without netem; rate-only profiles work here (tbf)"
    )


def parse_probe(exit_code: int, output: str, profile: NetworkProfile) -> tuple[LinkMeasurement, str]:
    """The probe's JSON line as a LinkMeasurement (median RTT) and the probe's address."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    message: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        message = json.loads(lines[-1]) if lines else {}
    if exit_code != 0 or message.get("event") != "measured":
        why = message.get("error") or f"exit {exit_code}"
        failure = f"network {profile.name}: the link probe failed: {why}"
        raise ScenarioFailed("network", failure, tail(output.encode()))
    rtts = tuple(float(rtt) for rtt in message["rtt_s"])
    rate = message.get("rate_bps")
    measurement = LinkMeasurement(statistics.median(rtts), rtts, None if rate is None else float(rate))
    return measurement, str(message["address"])


class NetworkHelpers:
    """The helper containers that emulate a scenario's network on its service's link and verify it;
    their image is built once a run needs it."""

    def __init__(self, client: docker.DockerClient, settings: BackendSettings, say: Say) -> None:
        self._client = client
        self._settings = settings
        self._say = say
        self._image_ready = False

    def emulate(self, service: ServiceContainer, probe_cpus: tuple[int, ...]) -> dict[str, Any]:
        """Emulate the profile on the service container's link, verify it, and say what was measured.

        Any failure is the scenario's, in phase "network"; the helpers are gone when this returns.
        """
        profile = service.scenario.network
        self._ensure_image()
        emulator = emulator_name(profile)
        params = tc_helper_params(profile, service.container)
        exit_code, output = self._run(service, "tc", params)
        if exit_code != 0:
            if NO_NETEM in output and emulator == "netem":
                raise ScenarioFailed("network", no_netem_message(profile), tail(output.encode()))
            raise ScenarioFailed(
                "network",
                f"network {profile.name}: tc in the service's network namespace failed (exit {exit_code})",
                tail(output.encode()),
            )
        measurement, client_address = self._verify_link(service, probe_cpus)
        if problems := measurement.problems(profile):
            raise ScenarioFailed("network", f"network {profile.name}: " + "; ".join(problems))
        return {
            "emulator": emulator,
            "service_address": service.ip,
            "client_address": client_address,  # the probe's, on k6's network
            "measured_rtt_s": measurement.rtt_s,
            "measured_rate_bps": measurement.rate_bps,
        }

    def _verify_link(self, service: ServiceContainer, cpus: tuple[int, ...]) -> tuple[LinkMeasurement, str]:
        """RTT (and for a rate, a bulk transfer) from a probe on k6's network, on k6's CPUs, to a
        peer in the service's namespace: the path k6's requests take."""
        profile = service.scenario.network
        serve = self._helper(
            service, "link-serve", **probe_serve_params(self._settings.root, service.container)
        )
        try:
            with docker_errors("network"):
                serve.start()
            params = probe_measure_params(self._settings.root, service.ip, profile, cpus)
            exit_code, output = self._run(service, "link-probe", params)
        finally:
            remove(serve)
        return parse_probe(exit_code, output, profile)

    def _helper(self, service: ServiceContainer, kind: str, **params: Any) -> Container:
        return create_container(
            self._client,
            "network",
            image=NETWORK_HELPER_IMAGE,
            name=f"{service.container.name}-{kind}",
            labels=labels(self._settings.run_id, service.scenario, "network"),
            **params,
        )

    def _run(self, service: ServiceContainer, kind: str, params: Mapping[str, Any]) -> tuple[int, str]:
        """Run a helper to its end: its exit code and output; it is removed in any case."""
        container = self._helper(service, kind, **params)
        try:
            with docker_errors("network"):
                container.start()
                try:
                    exit_code = int(container.wait(timeout=_HELPER_TIMEOUT_S)["StatusCode"])
                except RequestException:
                    raise ScenarioFailed(
                        "network", f"the network helper {kind} did not finish in {_HELPER_TIMEOUT_S} s"
                    ) from None
                output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        finally:
            remove(container)
        return exit_code, output

    def _ensure_image(self) -> None:
        """Build the helper image when it is missing or was built from another Dockerfile or base."""
        if self._image_ready:
            return
        base = os.environ.get("PYTHON_IMAGE") or PYTHON_IMAGE
        context = self._settings.root / NETWORK_HELPER_DIR
        base_id = ""  # a base the engine lacks is pulled by the build
        with docker_errors("network"), contextlib.suppress(ImageNotFound):
            base_id = str(self._client.images.get(base).id)
        inputs = helper_inputs((context / "Dockerfile").read_bytes(), base, base_id)
        with docker_errors("network"), contextlib.suppress(ImageNotFound):
            image_labels = self._client.images.get(NETWORK_HELPER_IMAGE).attrs["Config"].get("Labels") or {}
            self._image_ready = image_labels.get(INPUTS_LABEL) == inputs
        if self._image_ready:
            return
        self._say(f"docker: building {NETWORK_HELPER_IMAGE} from {base} (iproute2, for tc)")
        try:
            with docker_errors("network"):
                self._client.images.build(
                    path=str(context),
                    tag=NETWORK_HELPER_IMAGE,
                    # As compose does for services/Dockerfile: the build arg only when it is set.
                    buildargs={"PYTHON_IMAGE": base} if os.environ.get("PYTHON_IMAGE") else {},
                    labels={INPUTS_LABEL: inputs},
                    rm=True,
                )
        except BuildError as exc:
            log = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)
            raise ScenarioFailed(
                "network", f"building {NETWORK_HELPER_IMAGE} failed: {exc.msg}", tail(log.encode())
            ) from exc
        self._image_ready = True
