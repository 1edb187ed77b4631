"""The runner's check before measuring an upload (run/service_checks.verify with the scenario's body from
run/uploads.upload_body), over real sockets: a lab server started on port 0 passes it, REST and gRPC;
a small server in this test that serves the download right but answers an upload with a wrong checksum
or a wrong count fails it, with a message that names what it answered and what was sent."""

import json
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from labrunner.backends.base import Endpoint, ServiceHandle
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import UPLOAD, Overrides, Scenario
from labrunner.run.service_checks import GRPC_SERVICE, verify
from labrunner.run.uploads import UploadBody, upload_body

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.support import CERTS, ROOT, RunningService, launch_service

COUNT = 100
CA_FILE = CERTS / "ca.pem"
# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]

# (count, checksum) -> (count, checksum) the wrong server answers instead
Answer = Callable[[int, int], tuple[int, int]]
WRONG_CHECKSUM: Answer = lambda count, checksum: (count, (checksum + 1) % 2**32)  # noqa: E731
WRONG_COUNT: Answer = lambda count, checksum: (count - 1, checksum)  # noqa: E731


def _scenario(target: str) -> Scenario:
    """The upload preset's upload scenario of target, COUNT records, first round."""
    overrides = Overrides(targets=(target,), counts=(COUNT,), directions=(UPLOAD,), repeats=1)
    (scenario,) = expand(load_matrix(ROOT / "matrix.toml"), "local", "upload", overrides).scenarios
    assert scenario.direction == UPLOAD and scenario.count == COUNT
    return scenario


def _handle(scenario: Scenario, port: int, metrics_port: int | None = None) -> ServiceHandle:
    """What the runner knows of a service it started, here on 127.0.0.1:port."""
    address = Endpoint("127.0.0.1", port)
    metrics = Endpoint("127.0.0.1", metrics_port) if metrics_port is not None else None
    return ServiceHandle(
        scenario_id=scenario.id,
        service=scenario.target.service,
        address=address,
        k6_address=address,
        metrics_address=metrics,
        prometheus_target=None,
        workers=1,
        limits="none",
        service_cpus=(),
        k6_cpus=(),
    )


def _records(body: UploadBody) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(body.path.read_bytes())["records"]
    return records


@pytest.fixture
def body(tmp_path: Path) -> Callable[[Scenario], UploadBody]:
    """The scenario's body as the runner writes it before the run."""
    return lambda scenario: _written(upload_body(tmp_path, scenario))


def _written(found: UploadBody | None) -> UploadBody:
    assert found is not None and found.count == COUNT and found.path.is_file()
    return found


@pytest.fixture(scope="module", params=["aiohttp-h1", "grpc"])
def lab(request: pytest.FixtureRequest) -> Iterator[tuple[Scenario, RunningService]]:
    """A lab server as the scenario's target runs it (its service and env), on ports 0."""
    scenario = _scenario(str(request.param))
    service = launch_service(scenario.target.service, dict(scenario.target.env))
    yield scenario, service
    assert service.stop() == 0


def test_a_lab_server_passes_the_upload_check(
    lab: tuple[Scenario, RunningService], body: Callable[[Scenario], UploadBody]
) -> None:
    scenario, service = lab
    upload = body(scenario)
    verification = verify(_handle(scenario, service.port, service.metrics_port), scenario, CA_FILE, upload)
    assert verification.ok, verification.failures
    calls = ("CreateRecords", "UploadRecords") if scenario.target.is_grpc else ("REST POST /records",)
    for call in calls:
        assert f"{call}: {COUNT} records received, checksum {upload.checksum}" in verification.checks


class _WrongRest(BaseHTTPRequestHandler):
    """GET /records: the upload's records (the download check passes); POST /records: the count and
    checksum `answer` makes of the right ones."""

    protocol_version = "HTTP/1.1"  # what the target expects to negotiate
    records: ClassVar[list[dict[str, Any]]] = []  # set per server (_wrong_rest_server)
    expected: ClassVar[tuple[int, int]] = (0, 0)
    answer: ClassVar[Answer] = WRONG_CHECKSUM

    def do_GET(self) -> None:
        self._reply({"records": self.records})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        count, checksum = type(self).answer(*self.expected)
        self._reply({"count": count, "checksum": checksum})

    def _reply(self, document: object) -> None:
        data = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _wrong_rest_server(upload: UploadBody, answer: Answer) -> ThreadingHTTPServer:
    handler = type(
        "Handler",
        (_WrongRest,),
        {"records": _records(upload), "expected": (upload.count, upload.checksum), "answer": answer},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _WrongGrpc(cars_pb2_grpc.RecordServiceServicer):
    """ListRecords and StreamRecords: the upload's records; CreateRecords and UploadRecords: the count
    and checksum `answer` makes of the right ones."""

    def __init__(self, upload: UploadBody, answer: Answer) -> None:
        self.response = json_format.Parse(upload.path.read_bytes(), cars_pb2.ListRecordsResponse())
        self.reply = cars_pb2.CreateRecordsReply()
        self.reply.count, self.reply.checksum = answer(upload.count, upload.checksum)

    def ListRecords(self, request: Any, context: Any) -> cars_pb2.ListRecordsResponse:
        return self.response

    def StreamRecords(self, request: Any, context: Any) -> Iterator[cars_pb2.Record]:
        yield from self.response.records

    def CreateRecords(self, request: Any, context: Any) -> cars_pb2.CreateRecordsReply:
        return self.reply

    def UploadRecords(self, requests: Any, context: Any) -> cars_pb2.CreateRecordsReply:
        for _ in requests:
            pass
        return self.reply


def _wrong_grpc_server(upload: UploadBody, answer: Answer) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    cars_pb2_grpc.add_RecordServiceServicer_to_server(_WrongGrpc(upload, answer), server)
    checker = health.HealthServicer()
    for name in ("", GRPC_SERVICE):
        checker.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.mark.parametrize(
    ("answer", "answered"),
    [
        (WRONG_CHECKSUM, "count {count}, checksum {wrong}"),
        (WRONG_COUNT, "count {fewer}, checksum {checksum}"),
    ],
    ids=["wrong-checksum", "wrong-count"],
)
@pytest.mark.parametrize("target", ["aiohttp-h1", "grpc"])
def test_a_server_that_answers_an_upload_wrongly_fails_the_check_naming_the_mismatch(
    target: str, answer: Answer, answered: str, body: Callable[[Scenario], UploadBody]
) -> None:
    scenario = _scenario(target)
    upload = body(scenario)
    said = answered.format(
        count=COUNT, fewer=COUNT - 1, checksum=upload.checksum, wrong=(upload.checksum + 1) % 2**32
    )
    sent = f"sent {COUNT} records, checksum {upload.checksum}"
    calls: tuple[str, ...]
    if scenario.target.is_grpc:
        grpc_server, port = _wrong_grpc_server(upload, answer)
        try:
            verification = verify(_handle(scenario, port), scenario, CA_FILE, upload)
        finally:
            grpc_server.stop(grace=None)
        calls = ("CreateRecords", "UploadRecords")
    else:
        http_server = _wrong_rest_server(upload, answer)
        try:
            verification = verify(_handle(scenario, http_server.server_address[1]), scenario, CA_FILE, upload)
        finally:
            http_server.shutdown()
            http_server.server_close()
        calls = ("REST POST /records",)
    assert not verification.ok
    # The download check passed: the failures are the upload's mismatch and nothing else.
    assert verification.failures == tuple(f"{call}: the server answered {said}; {sent}" for call in calls)
    assert verification.protocol == ("grpc" if scenario.target.is_grpc else "HTTP/1.1")
