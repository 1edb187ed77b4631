"""docker-compose.yml without a Docker engine, its shape and wiring: the services against the contract
table and matrix.toml, health checks and dependencies, stop grace, volumes and mounts, documented
variables, and clients pointed at compose's services (InfluxDB's auth: test_compose_influxdb_auth.py).
"""

import re
import tomllib

import pytest
import yaml

from services.common.config import DEFAULT_PORTS
from tests.compose_file import compose, compose_variables
from tests.integration.compose_support import (
    ENV_EXAMPLE,
    LOOPBACK,
    container_port,
    contract_services,
    image_environment,
    published,
    seconds,
    systems_under_test,
)
from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# --- Shape and wiring ------------------------------------------------------------------------


def test_services_agree_with_the_contract_table() -> None:
    config = compose()
    suts = systems_under_test(config)
    assert {name for *_, name in contract_services()} == set(suts)
    for module, port, metrics_port, name in contract_services():
        service = suts[name]
        assert service["command"] == ["python", "-m", f"services.{module}"]
        env = image_environment(service["build"])
        assert (env["PROTOLAB_SERVICE"], env["PORT"], env["METRICS_PORT"]) == (
            module,
            str(port),
            str(metrics_port),
        )
        assert env["HOST"] == "0.0.0.0"
        assert set(published(service)) == {(LOOPBACK, str(p), str(p)) for p in (port, metrics_port)}
        assert service["image"] == f"protolab-{name}:local"


def test_the_services_default_ports_are_the_contract_tables() -> None:
    # The ports a service takes without PORT / METRICS_PORT, as compose builds its image with them.
    assert {module: (port, metrics) for module, port, metrics, _ in contract_services()} == DEFAULT_PORTS


def test_matrix_services_and_profile_p1_match_compose() -> None:
    matrix = tomllib.loads((ROOT / "matrix.toml").read_text())
    config = compose()
    built = {s["build"]["args"]["SERVICE"] for s in systems_under_test(config).values()}
    assert {target["service"] for target in matrix["targets"].values()} <= built
    for service in systems_under_test(config).values():
        assert float(service["cpus"]) == matrix["profiles"]["p1"]["cpus"]
        assert service["mem_limit"] == service["memswap_limit"] == matrix["profiles"]["p1"]["memory"]
    overridden = systems_under_test(compose({"SUT_CPUS": "0.5", "SUT_MEMORY": "512m"}))
    limits = {(s["cpus"], s["mem_limit"], s["memswap_limit"]) for s in overridden.values()}
    assert limits == {("0.5", "512m", "512m")}


def test_health_checks_and_dependencies_are_explicit() -> None:
    config = compose()
    for name, service in config["services"].items():
        if name == "certs" or "tools" in service.get("profiles", []):
            continue
        check = service.get("healthcheck", {})
        for key in ("test", "interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name}: healthcheck without {key}"
    for name, service in config["services"].items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            assert isinstance(spec, dict) and "condition" in spec, f"{name} -> {dependency}"
            target = config["services"][dependency]
            expected = "service_completed_successfully" if dependency == "certs" else "service_healthy"
            assert spec["condition"] == expected, f"{name} -> {dependency}"
            if expected == "service_healthy":
                assert "healthcheck" in target, dependency


def test_stop_grace_period_outlasts_the_graceful_shutdown() -> None:
    for name, service in systems_under_test(compose()).items():
        env = service["environment"]
        budget = float(env["SHUTDOWN_DRAIN_SECONDS"]) + float(env["SHUTDOWN_GRACE_SECONDS"])
        assert seconds(service["stop_grace_period"]) > budget, name


def test_data_lives_in_named_volumes() -> None:
    config = compose()
    expected = {"prometheus": "/prometheus", "influxdb": "/var/lib/influxdb", "grafana": "/var/lib/grafana"}
    for name, target in expected.items():
        volumes = [str(v) for v in config["services"][name]["volumes"]]
        named = [v for v in volumes if v.endswith(f":{target}") and not v.startswith(".")]
        assert named and named[0].split(":")[0] in config["volumes"], name
    assert config["volumes"]["certs"]["name"] == "protolab-certs"
    assert config["networks"]["default"]["name"] == "protolab"


def test_config_folders_are_mounted_whole_and_read_only() -> None:
    config = compose()["services"]
    mounts = {
        "prometheus": ("./prometheus:/etc/prometheus:ro",),
        "influxdb": ("./influxdb:/etc/influxdb:ro", "./influxdb/init:/docker-entrypoint-initdb.d:ro"),
        "grafana": (
            "./grafana/provisioning:/etc/grafana/provisioning:ro",
            "./grafana/dashboards:/var/lib/grafana/dashboards:ro",
        ),
        "k6": ("./k6:/k6:ro", "./proto:/proto:ro"),
    }
    for name, expected in mounts.items():
        for mount in expected:
            assert mount in config[name]["volumes"], (name, mount)
            assert (ROOT / mount.split(":")[0]).is_dir(), mount
    assert (ROOT / "influxdb" / "influxdb.conf").is_file()


def test_every_compose_variable_is_documented_in_env_example() -> None:
    documented = set(re.findall(r"^(\w+)=", ENV_EXAMPLE.read_text(), re.M))
    assert documented == compose_variables()


def test_prometheus_config_fits_its_mount() -> None:
    config = compose()["services"]["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in config["command"]
    prometheus = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    jobs = prometheus["scrape_configs"]
    patterns = [pattern for job in jobs for sd in job.get("file_sd_configs", []) for pattern in sd["files"]]
    statics = [
        target for job in jobs for static in job.get("static_configs", []) for target in static["targets"]
    ]
    assert patterns and statics, (
        "the checks below would check nothing"
    )  # the services' files, Prometheus itself
    for pattern in patterns:
        assert pattern.startswith("/etc/prometheus/targets/"), pattern
        assert (ROOT / "prometheus" / "targets").is_dir()
    for target in statics:
        host, port = target.rsplit(":", 1)
        assert host == "localhost" and (LOOPBACK, port, port) in published(config), target


def test_clients_point_at_compose_services() -> None:
    config = compose({"SUT_TLS": "1"})
    urls = [
        source["url"]
        for path in sorted((ROOT / "grafana" / "provisioning" / "datasources").glob("*.y*ml"))
        for source in yaml.safe_load(path.read_text()).get("datasources", [])
    ]
    k6 = config["services"]["k6"]["environment"]
    urls += [k6["K6_OUT"].split("=", 1)[1], k6["BASE_URL"], f"grpc://{k6['GRPC_ADDR']}"]
    assert k6["BASE_URL"].startswith("https://") and k6["TLS"] == "1"
    for url in urls:
        host, port = re.fullmatch(r"\w+://([\w-]+):(\d+)(?:/.*)?", url).groups()
        assert container_port(config, host, int(port)), url
    database = config["services"]["influxdb"]["environment"]["INFLUXDB_DB"]
    assert k6["K6_OUT"].endswith(f"/{database}")
    init = "".join(p.read_text() for p in (ROOT / "influxdb" / "init").glob("*.iql"))
    assert f"CREATE DATABASE {database}" in init
    grafana_mounts = [str(v).split(":")[1] for v in config["services"]["grafana"]["volumes"]]
    providers = [
        provider
        for path in (ROOT / "grafana" / "provisioning" / "dashboards").glob("*.y*ml")
        for provider in yaml.safe_load(path.read_text()).get("providers", [])
    ]
    assert providers, "no dashboard provider found: the check below would check nothing"
    for provider in providers:
        assert provider["options"]["path"] in grafana_mounts, provider
