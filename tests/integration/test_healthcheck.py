"""services.common.healthcheck against small in-process HTTP and gRPC servers, plain and TLS."""

import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import healthcheck

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass
class Pki:
    """A CA and a server certificate laid out as scripts/gen_certs.py does: ca.pem beside server.pem."""

    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server-key.pem"


def _make_pki(directory: Path) -> Pki:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Pki(directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "HOST", "TLS_CERT_FILE", "PROTOLAB_SERVICE"):
        monkeypatch.delenv(name, raising=False)
    # A proxy that answers nothing: the check must never route loopback through it.
    for name in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)


def _http_server(status: int, body: object, pki: Pki | None) -> ThreadingHTTPServer:
    payload = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = status if self.path == "/healthz" else 404
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if pki:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.cert, pki.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def http_server() -> Iterator:
    servers: list[ThreadingHTTPServer] = []

    def start(status: int = 200, body: object = None, pki: Pki | None = None) -> int:
        server = _http_server(status, {"status": "SERVING"} if body is None else body, pki)
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def grpc_server() -> Iterator:
    servers: list[grpc.Server] = []

    def start(status: int = health_pb2.HealthCheckResponse.SERVING, pki: Pki | None = None) -> int:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        servicer.set("", status)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        if pki:
            credentials = grpc.ssl_server_credentials([(pki.key.read_bytes(), pki.cert.read_bytes())])
            port = server.add_secure_port("127.0.0.1:0", credentials)
        else:
            port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.stop(None)


def test_http_serving_is_healthy(http_server, monkeypatch) -> None:
    monkeypatch.setenv("PORT", str(http_server()))
    assert healthcheck.main(["--protocol", "http"]) == 0


def test_http_not_serving_or_wrong_body_is_unhealthy(http_server, capsys) -> None:
    assert healthcheck.main(["--port", str(http_server(503, {"status": "NOT_SERVING"}))]) == 1
    assert "HTTP 503" in capsys.readouterr().err
    assert healthcheck.main(["--port", str(http_server(200, {"status": "UNKNOWN"}))]) == 1
    assert healthcheck.main(["--port", str(http_server(200, ["SERVING"]))]) == 1


def test_https_is_verified_against_the_ca_beside_the_cert(http_server, monkeypatch, pki, other_pki) -> None:
    port = str(http_server(pki=pki))
    monkeypatch.setenv("TLS_CERT_FILE", str(pki.cert))
    assert healthcheck.main(["--port", port]) == 0
    monkeypatch.setenv("TLS_CERT_FILE", str(other_pki.cert))
    assert healthcheck.main(["--port", port]) == 1


def test_grpc_serving_is_healthy_and_not_serving_is_not(grpc_server, monkeypatch) -> None:
    monkeypatch.setenv("PROTOLAB_SERVICE", "grpc_aio")  # the image's default protocol is gRPC
    assert healthcheck.main(["--port", str(grpc_server())]) == 0
    assert healthcheck.main(["--port", str(grpc_server(health_pb2.HealthCheckResponse.NOT_SERVING))]) == 1


def test_grpc_over_tls(grpc_server, monkeypatch, pki, other_pki, capsys) -> None:
    port = str(grpc_server(pki=pki))
    monkeypatch.setenv("TLS_CERT_FILE", str(pki.cert))
    assert healthcheck.main(["--protocol", "grpc", "--port", port]) == 0
    wrong_ca = str(other_pki.directory / "ca.pem")
    assert healthcheck.main(["--protocol", "grpc", "--port", port, "--ca-file", wrong_ca]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_nothing_listening_or_no_port_is_unhealthy(monkeypatch, capsys) -> None:
    assert healthcheck.main(["--port", "1", "--timeout", "1"]) == 1
    assert healthcheck.main(["--protocol", "grpc", "--port", "1", "--timeout", "1"]) == 1
    assert healthcheck.main([]) == 1
    assert "no port" in capsys.readouterr().err
    monkeypatch.setenv("TLS_CERT_FILE", "/nonexistent/server.pem")
    assert healthcheck.main(["--port", "1"]) == 1


def test_wildcard_listeners_are_reached_on_loopback() -> None:
    assert healthcheck.connect_host("0.0.0.0") == "127.0.0.1"
    assert healthcheck.connect_host("") == "127.0.0.1"
    assert healthcheck.connect_host("::") == "127.0.0.1"
    assert healthcheck.connect_host("127.0.0.2") == "127.0.0.2"
