"""Real k6 runs of k6/*.js against small in-test REST and gRPC servers on 127.0.0.1."""

from __future__ import annotations

import datetime
import functools
import importlib
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
from collections.abc import Iterator
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
from labrunner.observe import local_stack
from labrunner.observe.labels import INFLUXDB_DATABASE
from labrunner.run.k6 import SUMMARY_TREND_STATS, parse_summary

from tests.support import ROOT

K6_DIR = ROOT / "k6"
COUNT = 7
# k6 exit codes: thresholds failed, script exception (bad env), exec.test.abort().
K6_THRESHOLDS_FAILED = 99
K6_SCRIPT_EXCEPTION = 107
K6_ABORTED = 108

pytestmark = pytest.mark.timeout(120)


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


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_tls_material(tmp_path_factory.mktemp("certs"))


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
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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


@pytest.mark.parametrize("script", ["rest.js", "grpc_unary.js", "grpc_stream.js"])
def test_scripts_parse(script: str) -> None:
    options = k6_options(script, {"BASE_URL": "http://127.0.0.1:1", "GRPC_ADDR": "127.0.0.1:1"})
    # The clock's submetric has a threshold that always holds: k6 keeps it in the summary then.
    clock = "http_req_duration" if script == "rest.js" else "grpc_req_duration"
    clock += "{decoded:no,expected_response:true}" if script == "rest.js" else "{decoded:no}"
    assert options["thresholds"] == {
        "protolab_req_failed": ["rate<0.01"],
        "checks": ["rate==1.0"],
        clock: ["max>=0"],
    }
    stats = options["summaryTrendStats"]
    assert {"p(50)", "p(90)", "p(95)", "p(99)", "p(99.9)", "max", "avg", "min"} <= set(stats)
    assert stats == SUMMARY_TREND_STATS.split(",")  # the runner's: both read k6/lib/trend_stats.json


def test_rest_passes_and_writes_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer() as server:
        result = run_k6("rest.js", rest_env(server), summary=summary)
    assert result.returncode == 0, result.stderr
    assert "protolab: ok_reqs=" in result.stdout and "thresholds=ok" in result.stdout
    metrics = load_summary(summary)
    assert metrics["protolab_reqs"]["values"]["count"] > 0
    assert metrics["protolab_req_failed"]["values"]["rate"] == 0
    assert metrics["checks"]["values"]["rate"] == 1
    assert metrics["checks"]["values"]["passes"] > 0
    durations = metrics["http_req_duration{decoded:no,expected_response:true}"]["values"]
    assert {"avg", "min", "max", "p(50)", "p(90)", "p(95)", "p(99)"} <= durations.keys()
    assert "protolab_req_duration" not in metrics  # latency is k6's own timer only
    assert 0 < durations["p(50)"] <= durations["max"]


LOAD_MODELS = [
    (
        {"LOAD_MODEL": "constant-vus", "VUS": "3", "DURATION": "2s"},
        {"executor": "constant-vus", "vus": 3, "duration": "2s"},
    ),
    (
        {"LOAD_MODEL": "ramping-vus", "STAGES": "1s:3,1s:3,500ms:0"},
        {
            "executor": "ramping-vus",
            "startVUs": 0,
            "stages": [
                {"duration": "1s", "target": 3},
                {"duration": "1s", "target": 3},
                {"duration": "500ms", "target": 0},
            ],
        },
    ),
    (
        {"LOAD_MODEL": "constant-arrival-rate", "RATE": "50", "PRE_ALLOCATED_VUS": "2", "MAX_VUS": "8"},
        {
            "executor": "constant-arrival-rate",
            "rate": 50,
            "timeUnit": "1s",
            "duration": "2s",
            "preAllocatedVUs": 2,
            "maxVUs": 8,
        },
    ),
]


@pytest.mark.parametrize(("env", "scenario"), LOAD_MODELS)
def test_rest_load_models(tmp_path: Path, env: dict[str, str], scenario: dict[str, Any]) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer() as server:
        full_env = rest_env(server, **env)
        result = run_k6("rest.js", full_env, summary=summary)
    options = k6_options("rest.js", {"DURATION": "2s", **full_env})
    assert scenario.items() <= options["scenarios"]["main"].items()
    assert result.returncode == 0, result.stderr
    assert load_summary(summary)["protolab_reqs"]["values"]["count"] > 0


def test_rest_over_tls_trusts_ca_via_ssl_cert_file(tls_material: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_material
    with RecordsServer(tls=(cert, key)) as server:
        result = run_k6("rest.js", rest_env(server, TLS="1", SSL_CERT_FILE=str(ca)))
    assert result.returncode == 0, result.stderr


def test_rest_aborts_when_http2_is_expected_but_not_negotiated(tls_material: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_material
    with RecordsServer(tls=(cert, key)) as server:
        result = run_k6("rest.js", rest_env(server, TLS="1", SSL_CERT_FILE=str(ca), EXPECT_PROTO="HTTP/2.0"))
    assert result.returncode == K6_ABORTED, result.stderr
    assert "server negotiated HTTP/1.1 but EXPECT_PROTO=HTTP/2.0" in result.stderr


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


@pytest.fixture(scope="module")
def h2_server(
    tmp_path_factory: pytest.TempPathFactory, tls_material: tuple[Path, Path, Path]
) -> Iterator[str]:
    """Hypercorn over TLS offering h2 and http/1.1 via ALPN; yields its https base URL."""
    _, cert, key = tls_material
    app_dir = tmp_path_factory.mktemp("h2app")
    (app_dir / "h2app.py").write_text(H2_APP.format(record=json.dumps(fake_record(0))))
    # Hypercorn ends a connection after 1,000 requests by default (GOAWAY), which k6 reports
    # as a failed request: the lab's Quart service lifts the limit the same way.
    (app_dir / "hypercorn.toml").write_text("keep_alive_max_requests = 1_000_000_000\n")
    port = free_port()
    argv = [sys.executable, "-m", "hypercorn", "--config", "hypercorn.toml", "--bind", f"127.0.0.1:{port}"]
    argv += ["--certfile", str(cert), "--keyfile", str(key), "h2app:app"]
    proc = subprocess.Popen(argv, cwd=app_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not port_open(port):
            assert proc.poll() is None and time.monotonic() < deadline, "hypercorn did not start"
            time.sleep(0.1)
        yield f"https://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(("expect", "extra"), [("HTTP/2.0", {}), ("HTTP/1.1", {"GODEBUG": "http2client=0"})])
def test_rest_negotiates_http2_unless_the_runner_forces_http1(
    h2_server: str, tls_material: tuple[Path, Path, Path], expect: str, extra: dict[str, str]
) -> None:
    env = {"BASE_URL": h2_server, "COUNT": str(COUNT), "TLS": "1", "SSL_CERT_FILE": str(tls_material[0])}
    result = run_k6("rest.js", {**env, "EXPECT_PROTO": expect, "CHECK_EVERY": "5", **extra})
    assert result.returncode == 0, result.stderr


def test_rest_wrong_record_count_fails_thresholds(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    with RecordsServer(short=1) as server:
        result = run_k6("rest.js", rest_env(server), summary=summary)
    assert result.returncode == K6_THRESHOLDS_FAILED, result.stderr
    assert "thresholds=FAILED" in result.stdout
    metrics = load_summary(summary)
    assert metrics["checks"]["values"]["fails"] > 0
    assert metrics["protolab_req_failed"]["values"]["passes"] > 0  # Rate "passes" = failed requests


def test_bad_load_model_is_a_script_error() -> None:
    with RecordsServer() as server:
        result = run_k6("rest.js", rest_env(server, LOAD_MODEL="closed-loop"))
    assert result.returncode == K6_SCRIPT_EXCEPTION
    assert "unknown LOAD_MODEL=closed-loop" in result.stderr


def influx_series(influx_url: str, query: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"db": INFLUXDB_DATABASE, "q": query})
    with urllib.request.urlopen(f"{influx_url}/query?{params}", timeout=10) as resp:
        series: list[dict[str, Any]] = json.load(resp)["results"][0].get("series", [])
    return series


def influx_count(influx_url: str, query: str) -> int:
    series = influx_series(influx_url, query)
    return int(series[0]["values"][0][1]) if series else 0


def test_k6_metrics_reach_influxdb(tmp_path: Path) -> None:
    ports = local_stack.Ports(prometheus=free_port(), influxdb=free_port(), influxdb_rpc=free_port())
    obs_dir = tmp_path / "obs"
    try:
        urls = local_stack.start(obs_dir, targets_dir=tmp_path / "targets", ports=ports)
        with RecordsServer() as server:
            result = run_k6(
                "rest.js",
                rest_env(server),
                "--out",
                f"influxdb={urls['influxdb']}/{INFLUXDB_DATABASE}",
                "--tag",
                "scenario=influx-test",
            )
        assert result.returncode == 0, result.stderr
        count = influx_count(
            urls["influxdb"], """SELECT sum("value") FROM "protolab_reqs" WHERE "scenario" = 'influx-test'"""
        )
        assert count > 0
        # Each point carries the tags the dashboards group by and nothing constant besides the
        # runner's: no url or name (the URL, as a tag and as a string field), group, tls_version;
        # decoded: whether k6 decoded the reply, which the lab's latency clock leaves out.
        [tags] = influx_series(urls["influxdb"], 'SHOW TAG KEYS FROM "http_req_duration"')
        kept = {"decoded", "expected_response", "method", "proto", "scenario", "status"}
        assert {key for [key] in tags["values"]} == kept
        [fields] = influx_series(urls["influxdb"], 'SHOW FIELD KEYS FROM "http_req_duration"')
        assert fields["values"] == [["value", "float"]]
    finally:
        local_stack.stop(obs_dir)


# --- gRPC: a minimal RecordService built from proto/cars.proto with grpcio ---


@pytest.fixture(scope="module")
def pb() -> tuple[ModuleType, ModuleType]:
    """The project's generated stubs: a second copy would clash in the protobuf descriptor pool."""
    return importlib.import_module("services.common.pb.cars_pb2"), importlib.import_module(
        "services.common.pb.cars_pb2_grpc"
    )


class GrpcServer:
    """RecordService on 127.0.0.1: ListRecords and StreamRecords return count - short records."""

    def __init__(
        self,
        pb: tuple[ModuleType, ModuleType],
        short: int = 0,
        tls: tuple[Path, Path] | None = None,
        delay_s: float = 0.0,
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
            return reply_of((request.count if request.HasField("count") else 100) - short)

        def stream_records(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
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


@pytest.mark.parametrize("script", ["grpc_unary.js", "grpc_stream.js"])
def test_grpc_passes(tmp_path: Path, pb: tuple[ModuleType, ModuleType], script: str) -> None:
    summary = tmp_path / "summary.json"
    with GrpcServer(pb) as server:
        result = run_k6(script, grpc_env(server), summary=summary)
    assert result.returncode == 0, result.stderr
    metrics = load_summary(summary)
    assert metrics["protolab_reqs"]["values"]["count"] > 0
    assert metrics["checks"]["values"]["rate"] == 1 and metrics["checks"]["values"]["passes"] > 0
    assert metrics["grpc_req_duration{decoded:no}"]["values"]["p(50)"] > 0


@pytest.mark.parametrize("script", ["rest.js", "grpc_unary.js"])
def test_the_summary_and_the_runners_metrics_carry_p99_9(
    tmp_path: Path, pb: tuple[ModuleType, ModuleType], script: str
) -> None:
    # Started elsewhere than the repository, as `docker compose run` does: common.js finds
    # trend_stats.json beside itself, not in the working directory.
    summary = tmp_path / "summary.json"
    server = RecordsServer() if script == "rest.js" else GrpcServer(pb)
    with server:
        env = rest_env(server) if isinstance(server, RecordsServer) else grpc_env(server)
        result = run_k6(script, env, summary=summary, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # The lab's latency is k6's own timer of each undecoded request, never a JavaScript window.
    clock = (
        "http_req_duration{decoded:no,expected_response:true}"
        if script == "rest.js"
        else "grpc_req_duration{decoded:no}"
    )
    durations = load_summary(summary)[clock]["values"]
    assert durations["p(99)"] <= durations["p(99.9)"] <= durations["max"]
    metrics = parse_summary(json.loads(summary.read_text()))
    latency = metrics.latency_ms
    assert metrics.latency_metric == clock and metrics.latency_count == durations["count"]
    assert latency["p99.9"] == durations["p(99.9)"] and latency["p99"] <= latency["p99.9"] <= latency["max"]
    assert dict(metrics.latency_quantiles_ms)[0.999] == durations["p(99.9)"]


def test_the_rest_and_grpc_clocks_agree_on_equal_work(
    tmp_path: Path, pb: tuple[ModuleType, ModuleType]
) -> None:
    """Both servers answer after 20 ms with 600 records serialized once; k6 decodes and checks
    every other reply (CHECK_EVERY=2). The lab's clock times the undecoded requests on k6's own
    timer, so both medians are the 20 ms and the wire. A window timed in JavaScript, as the lab's
    gRPC figure once was, holds k6 turning decoded records into JavaScript: here k6's
    iteration_duration, milliseconds more (printed in the assertion message)."""
    delay, records = 0.020, "600"  # under 64 KiB of protobuf: one HTTP/2 flow-control window
    latency, window = {}, {}
    with RecordsServer(delay_s=delay) as rest, GrpcServer(pb, delay_s=delay) as grpc_server:
        for script, env in (
            ("rest.js", rest_env(rest, COUNT=records, CHECK_EVERY="2")),
            ("grpc_unary.js", grpc_env(grpc_server, COUNT=records, CHECK_EVERY="2")),
        ):
            summary = tmp_path / f"{script}.json"
            result = run_k6(script, {**env, "VUS": "1"}, summary=summary)
            assert result.returncode == 0, result.stderr
            data = json.loads(summary.read_text())
            latency[script] = parse_summary(data).latency_ms
            window[script] = data["metrics"]["iteration_duration"]["values"]["p(90)"]
    rest_ms, grpc_ms = latency["rest.js"]["p50"], latency["grpc_unary.js"]["p50"]
    assert rest_ms is not None and grpc_ms is not None
    note = (
        f"p50 on the clock: REST {rest_ms:.2f} ms, gRPC {grpc_ms:.2f} ms; p90 of the iterations, "
        f"decoded replies included: REST {window['rest.js']:.2f}, gRPC {window['grpc_unary.js']:.2f}"
    )
    assert delay * 1000 <= min(rest_ms, grpc_ms) and abs(grpc_ms - rest_ms) < 1.5, note
    # The decoded half is outside the clock: its p90 is an undecoded call's, well below the window's.
    grpc_p90 = latency["grpc_unary.js"]["p90"]
    assert grpc_p90 is not None and grpc_p90 + 5 < window["grpc_unary.js"], note


@pytest.mark.parametrize("script", ["grpc_unary.js", "grpc_stream.js"])
def test_grpc_wrong_record_count_fails_thresholds(pb: tuple[ModuleType, ModuleType], script: str) -> None:
    with GrpcServer(pb, short=1) as server:
        result = run_k6(script, grpc_env(server))
    assert result.returncode == K6_THRESHOLDS_FAILED, result.stderr


def test_grpc_over_tls_trusts_ca_via_ssl_cert_file(
    pb: tuple[ModuleType, ModuleType], tls_material: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_material
    with GrpcServer(pb, tls=(cert, key)) as server:
        result = run_k6("grpc_unary.js", grpc_env(server, TLS="1", SSL_CERT_FILE=str(ca)))
    assert result.returncode == 0, result.stderr
