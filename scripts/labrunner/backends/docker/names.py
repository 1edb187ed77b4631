"""Names docker-compose.yml fixes (tests/unit/test_docker_names.py checks they agree), and the
names and labels the docker backend gives its containers."""

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labrunner.model.scenario import Scenario
from services.common import user_message
from services.common.stacks import BY_PACKAGE

NETWORK = "protolab"  # networks.default.name
CERTS_VOLUME = "protolab-certs"  # volumes.certs.name, filled by the one-shot `certs` service
K6_IMAGE = "grafana/k6:1.1.0"  # services.k6.image's default; K6_IMAGE overrides both
INFLUXDB_IN_NETWORK = "influxdb:8086"  # the influxdb service as k6 reaches it on the network
CERTS_DIR = "/certs"
K6_DIR, PROTO_DIR, RESULTS_DIR = "/k6", "/proto", "/results"
# The files of the user's own message (--proto: the run's shape/ directory), read-only in the service's
# and k6's containers.
SHAPE_DIR = "/shape"


def shape_mount() -> dict[Path, str]:
    """The run's shape/ directory and where containers see it, when the run serves the user's message."""
    user = user_message.installed()
    return {} if user is None else {user.directory: SHAPE_DIR}


# The hardening every compose service under test has (x-service in docker-compose.yml).
SERVICE_HARDENING: Mapping[str, Any] = {
    "init": True,  # tini as PID 1 forwards SIGTERM to the supervisor and reaps workers
    "read_only": True,
    "tmpfs": {"/tmp": ""},  # PROMETHEUS_MULTIPROC_DIR lives here
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges:true"],
}
NOFILE = 65536  # services' and k6's ulimits.nofile default; SERVICE_NOFILE overrides both
MANAGED_LABEL = "protolab.managed"
_DNS_LABEL_MAX = 63  # Prometheus resolves the container name: it must be one DNS label


def image_name(service: str) -> str:
    """The image docker-compose.yml builds for a service module: protolab-rest-aiohttp:local."""
    return f"protolab-{compose_name(service)}:local"


def compose_name(service: str) -> str:
    """The compose service (and certificate SAN) of a service module: rest_aiohttp -> rest-aiohttp."""
    return BY_PACKAGE[service].compose_name


def container_name(run_id: str, scenario_id: str) -> str:
    """Unique per run and scenario, and a valid DNS label, since Prometheus scrapes it by name."""
    name = "protolab-" + re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{scenario_id}".lower()).strip("-")
    if len(name) <= _DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _DNS_LABEL_MAX - 9].rstrip('-')}-{digest}"


def labels(run_id: str, scenario: Scenario, role: str) -> dict[str, str]:
    return {
        MANAGED_LABEL: "true",
        "protolab.run": run_id,
        "protolab.scenario": scenario.id,
        "protolab.target": scenario.target.name,
        "protolab.profile": scenario.profile.name,
        "protolab.role": role,
    }
