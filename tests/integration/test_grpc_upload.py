"""The gRPC upload calls (CreateRecords, UploadRecords) on both lab servers and both gRPC floors, over
real sockets: the reply's count and checksum are those of the records sent, computed here from the
pool's JSON; each bad input gets its status code and the same message everywhere, and the server goes
on serving; the lab servers count the calls in their grpc_server_* series."""

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import load_pool
from tests.support import GRPC_SERVERS, RunningService, launch_service

SERVICE = "protolab.cars.v1.RecordService"
POOL_SIZE, SEED, MAX_COUNT = 2000, 42, 1000
MAX_REQUEST_BYTES = 1 << 20  # MAX_REQUEST_BYTES' default (services/common/config.py)
ENV = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), "MAX_COUNT": str(MAX_COUNT)}
# (package, module): the lab's servers and their floors (benchmarks/floor/), module names alike.
IMPLEMENTATIONS = [
    (package, module) for package in ("services", "benchmarks.floor") for module in GRPC_SERVERS
]
# Bytes no protobuf parser takes (a field number of 0 and wire type 7, repeated).
UNDECODABLE = b"\xff" * 64

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]

JsonRecord = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def pool() -> list[JsonRecord]:
    return load_pool(POOL_SIZE, SEED)


@pytest.fixture(
    scope="module", params=IMPLEMENTATIONS, ids=[f"{p.split('.')[-1]}-{m}" for p, m in IMPLEMENTATIONS]
)
def service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    package, module = request.param
    started = launch_service(module, ENV, package=package)
    yield started
    assert started.process.poll() is None, "the server died during the module"
    assert started.stop() == 0


@pytest.fixture
def channel(service: RunningService) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as opened:
        yield opened


def checksum(records: list[JsonRecord]) -> int:
    """CreateRecordsReply.checksum by its definition (proto/cars.proto), from the records' JSON."""
    total = 0
    for record in records:
        car, driver = record["car"], record["driver"]
        total += car["year"] + car["mileage"]
        total += sum(len(car[name]) for name in ("make", "model", "trim", "color"))
        total += sum(len(driver[name]) for name in ("firstname", "lastname", "driverId"))
    return total % 2**32


def messages(records: list[JsonRecord]) -> list[cars_pb2.Record]:
    return [json_format.ParseDict(record, cars_pb2.Record()) for record in records]


def window(pool: list[JsonRecord], count: int, start: int = 1500) -> list[JsonRecord]:
    """count records of the pool from start, wrapping around its end."""
    return [pool[(start + i) % len(pool)] for i in range(count)]


def create(channel: grpc.Channel, records: list[cars_pb2.Record]) -> cars_pb2.CreateRecordsReply:
    stub = cars_pb2_grpc.RecordServiceStub(channel)
    return stub.CreateRecords(cars_pb2.CreateRecordsRequest(records=records), timeout=10)


def upload(channel: grpc.Channel, records: list[cars_pb2.Record]) -> cars_pb2.CreateRecordsReply:
    return cars_pb2_grpc.RecordServiceStub(channel).UploadRecords(iter(records), timeout=10)


CALLS = {"unary": create, "stream": upload}


@pytest.mark.parametrize("kind", list(CALLS))
@pytest.mark.parametrize("count", [1, 100, MAX_COUNT])
def test_the_reply_counts_and_checksums_the_records_sent(
    channel: grpc.Channel, pool: list[JsonRecord], kind: str, count: int
) -> None:
    records = window(pool, count)
    reply = CALLS[kind](channel, messages(records))
    assert (reply.count, reply.checksum) == (count, checksum(records))


def test_a_changed_field_changes_the_checksum(channel: grpc.Channel, pool: list[JsonRecord]) -> None:
    records = window(pool, 3)
    changed = [records[0], records[1], {**records[2], "car": {**records[2]["car"], "mileage": 7}}]
    assert checksum(changed) != checksum(records)
    for call in CALLS.values():
        assert call(channel, messages(changed)).checksum == checksum(changed)


def assert_still_serving(channel: grpc.Channel, pool: list[JsonRecord]) -> None:
    for call in CALLS.values():
        assert call(channel, messages(pool[:2])).count == 2


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as error:
        call()
    return error.value.code(), error.value.details()


def oversized() -> cars_pb2.Record:
    record = cars_pb2.Record()
    record.car.make = "x" * MAX_REQUEST_BYTES
    return record


# Each bad input of each call, and the status and message every implementation answers it with.
BAD_INPUTS: dict[str, tuple[Callable[[grpc.Channel, list[JsonRecord]], object], grpc.StatusCode, str]] = {
    "unary, no record": (
        lambda channel, _pool: create(channel, []),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"records: expected 1 to {MAX_COUNT} records, got 0",
    ),
    "unary, MAX_COUNT + 1 records": (
        lambda channel, pool: create(channel, messages(window(pool, MAX_COUNT + 1))),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"records: expected 1 to {MAX_COUNT} records, got {MAX_COUNT + 1}",
    ),
    "unary, undecodable": (
        lambda channel, _pool: channel.unary_unary(f"/{SERVICE}/CreateRecords")(UNDECODABLE, timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not a valid protolab.cars.v1.CreateRecordsRequest message",
    ),
    "unary, over MAX_REQUEST_BYTES": (
        lambda channel, _pool: create(channel, [oversized()]),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    "stream, no record": (
        lambda channel, _pool: upload(channel, []),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"records: expected 1 to {MAX_COUNT} records, got 0",
    ),
    "stream, MAX_COUNT + 1 records": (
        lambda channel, pool: upload(channel, messages(window(pool, MAX_COUNT + 1))),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"records: expected 1 to {MAX_COUNT} records, got {MAX_COUNT + 1}",
    ),
    "stream, an undecodable message after a good one": (
        lambda channel, pool: channel.stream_unary(f"/{SERVICE}/UploadRecords")(
            iter([messages(pool[:1])[0].SerializeToString(), UNDECODABLE]), timeout=10
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not a valid protolab.cars.v1.Record message",
    ),
    "stream, a message over MAX_REQUEST_BYTES": (
        lambda channel, pool: upload(channel, [*messages(pool[:1]), oversized()]),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gets_its_status_and_the_server_goes_on(
    channel: grpc.Channel, pool: list[JsonRecord], name: str
) -> None:
    call, code, message = BAD_INPUTS[name]
    status, details = refused(lambda: call(channel, pool))
    assert status == code, (status, details)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:  # the wording and sizes are the framework's
        assert message in details, details
    else:
        assert details == message
    assert_still_serving(channel, pool)


# --- metrics (the lab servers; the floors have none)

CREATE = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": "CreateRecords"}
UPLOAD = {"grpc_type": "client_stream", "grpc_service": SERVICE, "grpc_method": "UploadRecords"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(service: RunningService) -> Samples:
    text = urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5).read()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, labels: dict[str, str], **extra: str) -> float:
    return samples[name, frozenset({**labels, **extra}.items())]


def handled(samples: Samples, labels: dict[str, str]) -> tuple[float, float]:
    """The calls handled OK and InvalidArgument."""
    ok, invalid = (
        value(samples, "grpc_server_handled_total", labels, grpc_code=code)
        for code in ("OK", "InvalidArgument")
    )
    return ok, invalid


def settled(samples: Samples) -> bool:
    """Every call started is handled and timed (a worker flushes its series every 0.5 s, one by one)."""
    return all(
        value(samples, "grpc_server_started_total", labels)
        == 2
        == sum(handled(samples, labels))
        == value(samples, "grpc_server_handling_seconds_count", labels)
        for labels in (CREATE, UPLOAD)
    )


@pytest.mark.parametrize("module", GRPC_SERVERS)
def test_the_lab_servers_count_uploads(
    start_service: Callable[..., RunningService], pool: list[JsonRecord], module: str
) -> None:
    service = start_service(module, ENV)
    before = scrape(service)
    for labels in (CREATE, UPLOAD):  # the series exist from start-up, at 0
        assert value(before, "grpc_server_started_total", labels) == 0
        assert value(before, "grpc_server_msg_received_total", labels) == 0
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        assert create(channel, messages(pool[:3])).count == 3
        assert refused(lambda: create(channel, []))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert upload(channel, messages(pool[:5])).count == 5
        assert refused(lambda: upload(channel, []))[0] == grpc.StatusCode.INVALID_ARGUMENT
    deadline = time.monotonic() + 10
    samples = scrape(service)
    while not settled(samples) and time.monotonic() < deadline:
        time.sleep(0.05)
        samples = scrape(service)
    for labels in (CREATE, UPLOAD):
        assert value(samples, "grpc_server_started_total", labels) == 2, labels
        assert handled(samples, labels) == (1, 1), labels
        assert value(samples, "grpc_server_msg_sent_total", labels) == 1, labels
    assert value(samples, "grpc_server_msg_received_total", CREATE) == 2  # one request each
    assert value(samples, "grpc_server_msg_received_total", UPLOAD) == 5  # one per record streamed
