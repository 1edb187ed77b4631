"""What the k6 script tests (tests/e2e/test_k6_*.py, test_live_line.py) share: k6 run on k6/*.js, and
small in-test REST and gRPC servers on 127.0.0.1 that answer with fake records.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import json_format

from tests.support import ROOT

K6_DIR = ROOT / "k6"
COUNT = 7
# k6 exit codes: thresholds failed, script exception (bad env), exec.test.abort().
K6_THRESHOLDS_FAILED = 99
K6_SCRIPT_EXCEPTION = 107
K6_ABORTED = 108


def k6_binary() -> str:
    """k6 from K6_BIN, PATH, or next to this Python (the lab's venv)."""
    for candidate in (os.environ.get("K6_BIN"), shutil.which("k6"), str(Path(sys.executable).parent / "k6")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("k6 not found (set K6_BIN)")


def run_k6(
    script: str, env: dict[str, str], *args: str, summary: Path | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run k6/<script> with env (plus os.environ), no usage report; returns the finished process."""
    full_env = {**os.environ, "K6_NO_USAGE_REPORT": "true", "DURATION": "2s", "VUS": "2", **env}
    if summary is not None:
        full_env["SUMMARY_FILE"] = str(summary)
    return subprocess.run(
        [k6_binary(), "run", "--quiet", *args, str(K6_DIR / script)],
        env=full_env,
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )


def fake_record(i: int) -> dict[str, dict[str, Any]]:
    """A record in the contract's JSON shape; mileage 0 proves zero values are not dropped."""
    return {
        "car": {"make": "Ford", "model": "Focus", "trim": "ST", "color": "red", "year": 2020, "mileage": 0},
        "driver": {"firstname": "Ada", "lastname": "Lovelace", "driverId": f"D{i}"},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def make_tls_material(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server cert for 127.0.0.1/localhost; returns (ca.pem, server.pem, server-key.pem)."""
    now = datetime.datetime.now(datetime.UTC)

    def build(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, is_ca: bool
    ) -> x509.CertificateBuilder:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        )
        if not is_ca:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "protolab test CA")])
    ca_cert = build("protolab test CA", ca_key, ca_name, is_ca=True).sign(ca_key, hashes.SHA256())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build("localhost", key, ca_name, is_ca=False).sign(ca_key, hashes.SHA256())
    paths = (directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def send_json(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """A 200 JSON response, saying Connection: close to a request that asked for it, as the lab's
    servers do (http.server closes the connection without saying so). Go's HTTP/1.1 client (k6) keeps a
    connection after a request of its own with Connection: close unless the response says it too: it
    would send its next request on the connection the server closed (k6/rest.js CHURN)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    if handler.close_connection:
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


# Hypercorn over TLS, h2 and http/1.1 offered by ALPN: GET /records?count=N answers N fake records.
H2_APP = """
import json
from urllib.parse import parse_qs

RECORD = json.loads({record!r})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    count = int(parse_qs(scope["query_string"].decode()).get("count", ["100"])[0])
    body = json.dumps({{"records": [RECORD] * count}}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({{"type": "http.response.start", "status": 200, "headers": headers}})
    await send({{"type": "http.response.body", "body": body}})
"""


def write_h2_app(directory: Path) -> str:
    """H2_APP as a module in directory; its app for hypercorn_tls."""
    (directory / "h2app.py").write_text(H2_APP.format(record=json.dumps(fake_record(0))))
    return "h2app:app"


@contextlib.contextmanager
def hypercorn_tls(
    directory: Path, app: str, tls_material: tuple[Path, Path, Path], *options: str
) -> Iterator[int]:
    """Hypercorn serving `app` (module:attribute, the module in directory) over TLS on a free port,
    with its further command-line options; yields the port once it listens."""
    _, cert, key = tls_material
    port = free_port()
    argv = [sys.executable, "-m", "hypercorn", *options, "--bind", f"127.0.0.1:{port}"]
    argv += ["--certfile", str(cert), "--keyfile", str(key), app]
    proc = subprocess.Popen(argv, cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not port_open(port):
            assert proc.poll() is None and time.monotonic() < deadline, "hypercorn did not start"
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class RecordsServer:
    """GET /records?count=N -> N fake records (minus `short` of them, to fake a broken server)."""

    def __init__(self, short: int = 0, tls: tuple[Path, Path] | None = None, delay_s: float = 0.0) -> None:
        body_for = functools.cache(
            lambda n: json.dumps({"records": [fake_record(i) for i in range(max(0, n - short))]}).encode()
        )

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the real services
            # Headers and body go out in two writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK (40 ms on Linux), as the real servers never make it wait.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path != "/records":
                    self.send_error(404)
                    return
                count = int(urllib.parse.parse_qs(url.query).get("count", ["100"])[0])
                body = body_for(count)
                time.sleep(delay_s)
                send_json(self, body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            context.set_alpn_protocols(["http/1.1"])  # this server cannot speak h2
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecordsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def rest_env(server: RecordsServer, **extra: str) -> dict[str, str]:
    return {
        "BASE_URL": server.url,
        "COUNT": str(COUNT),
        "EXPECT_PROTO": "HTTP/1.1",
        "CHECK_EVERY": "5",
        **extra,
    }


def load_summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["metrics"]


def k6_options(script: str, env: dict[str, str]) -> dict[str, Any]:
    """The options k6 derives from script under env (`k6 inspect`; init code runs, no load)."""
    result = subprocess.run(
        [
            k6_binary(),
            "inspect",
            *(f"--env={key}={value}" for key, value in env.items()),
            str(K6_DIR / script),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class CountingRelay:
    """A TCP relay on 127.0.0.1 to `port`; `accepted`: the connections it took, every one a client
    opened; `closed`: those the client closed (its end read to EOF); `most_open`: the most open at once
    (accepted less closed), taken at each accept; `client_bytes` and `server_bytes`: the bytes it
    relayed each way, every one counted before it is passed on (so a reply the client has read is
    counted); `ended`: the directions (two a connection) read to EOF, each's bytes all counted."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = self.closed = self.most_open = 0
        self.client_bytes = self.server_bytes = self.ended = 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []

    def __enter__(self) -> CountingRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.most_open = max(self.most_open, self.accepted - self.closed)
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self.lock:
                    if from_client:
                        self.client_bytes += len(data)
                    else:
                        self.server_bytes += len(data)
                sink.sendall(data)
            with self.lock:
                self.ended += 1
                if from_client:
                    self.closed += 1
            sink.shutdown(socket.SHUT_WR)


# --- gRPC: a minimal RecordService built from proto/cars.proto with grpcio ---


class GrpcServer:
    """RecordService on 127.0.0.1: ListRecords and StreamRecords return count - short records. gate, when
    given, runs in every call's thread before it answers (a test's hold on calls in flight)."""

    def __init__(
        self,
        pb: tuple[ModuleType, ModuleType],
        short: int = 0,
        tls: tuple[Path, Path] | None = None,
        delay_s: float = 0.0,
        gate: Callable[[], None] = lambda: None,
    ) -> None:
        cars_pb2, _ = pb

        @functools.cache
        def records_of(n: int) -> list[Any]:
            # The REST JSON shape parses into the gRPC message (the data contract).
            return [json_format.ParseDict(fake_record(i), cars_pb2.Record()) for i in range(n)]

        def records(request: Any) -> list[Any]:
            return records_of((request.count if request.HasField("count") else 100) - short)

        @functools.cache
        def reply_of(n: int) -> bytes:
            return cars_pb2.ListRecordsResponse(records=records_of(n)).SerializeToString()

        def list_records(request: Any, context: grpc.ServicerContext) -> bytes:
            # Serialized once per count, like the REST server's body: equal work on both sides.
            time.sleep(delay_s)
            gate()
            return reply_of((request.count if request.HasField("count") else 100) - short)

        def stream_records(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            gate()
            yield from records(request)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            "ListRecords": grpc.unary_unary_rpc_method_handler(
                list_records,
                request_deserializer=cars_pb2.ListRecordsRequest.FromString,
                response_serializer=bytes,
            ),
            "StreamRecords": grpc.unary_stream_rpc_method_handler(
                stream_records,
                request_deserializer=cars_pb2.ListRecordsRequest.FromString,
                response_serializer=cars_pb2.Record.SerializeToString,
            ),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("protolab.cars.v1.RecordService", handlers),)
        )
        if tls is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            creds = grpc.ssl_server_credentials([(tls[1].read_bytes(), tls[0].read_bytes())])
            port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.addr = f"127.0.0.1:{port}"

    def __enter__(self) -> GrpcServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)


def grpc_env(server: GrpcServer, **extra: str) -> dict[str, str]:
    return {"GRPC_ADDR": server.addr, "COUNT": str(COUNT), "CHECK_EVERY": "5", **extra}
