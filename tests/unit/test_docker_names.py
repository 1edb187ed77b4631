"""The docker backend's names: unique DNS labels for containers, and the names docker-compose.yml fixes."""

from labrunner.backends.docker import names as docker_names

from tests.docker_fake import COMPOSE, MATRIX

# --- Names -------------------------------------------------------------------------------------


def test_container_names_are_unique_dns_labels() -> None:
    assert docker_names.container_name("20250101-120000", "quart-h2-tls.p1.c100.closed.r1") == (
        "protolab-20250101-120000-quart-h2-tls-p1-c100-closed-r1"
    )
    long_a = docker_names.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r10"
    )
    long_b = docker_names.container_name(
        "a_very.long-run-id-2025", "quart-h2-tls.p1.c1000.a-long-load-model.r11"
    )
    assert long_a != long_b
    for name in (long_a, long_b):
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower(), name


def test_names_agree_with_docker_compose() -> None:
    services = COMPOSE["services"]
    assert COMPOSE["networks"]["default"]["name"] == docker_names.NETWORK
    assert COMPOSE["volumes"]["certs"]["name"] == docker_names.CERTS_VOLUME
    k6 = services["k6"]
    assert k6["image"] == docker_names.K6_IMAGE
    assert k6["environment"]["K6_OUT"] == f"influxdb=http://{docker_names.INFLUXDB_IN_NETWORK}/myk6db"
    assert {"./k6:/k6:ro", "./proto:/proto:ro", "certs:/certs:ro"} <= set(k6["volumes"])
    assert k6["environment"]["SSL_CERT_FILE"] == "/certs/ca.pem"
    built = {name: s for name, s in services.items() if "SERVICE" in s.get("build", {}).get("args", {})}
    assert {t.service for t in MATRIX.targets.values()} <= {
        s["build"]["args"]["SERVICE"] for s in built.values()
    }
    for name, service in built.items():
        module = service["build"]["args"]["SERVICE"]
        assert (docker_names.compose_name(module), docker_names.image_name(module)) == (
            name,
            service["image"],
        )
        # The runner's containers are hardened like compose's services under test.
        hardening = {key: service[key] for key in ("init", "read_only", "cap_drop", "security_opt")}
        assert {**hardening, "tmpfs": dict.fromkeys(service["tmpfs"], "")} == docker_names.SERVICE_HARDENING
        assert int(service["ulimits"]["nofile"]) == docker_names.NOFILE
        assert service["volumes"] == [f"certs:{docker_names.CERTS_DIR}:ro"]
        assert service["mem_limit"] == service["memswap_limit"]
