"""Every gRPC service (grpc.aio, grpclib) over real sockets: the contract (health, reflection, list
and stream against the record pool, every window, live mode), bad input, one worker on a busy port,
and equal work: REST bodies equal gRPC messages.
"""

from collections.abc import Callable, Iterator

import grpc
import grpc.aio
import httpx
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import generate_pool
from tests.integration.grpc_support import (
    BASE_ENV,
    MAX_COUNT,
    POOL_SIZE,
    SEED,
    SERVICE,
    expected_response,
    request,
    scrape,
    target,
)
from tests.support import CERTS, GRPC_SERVERS, REST_SERVERS, RunningService, launch_service, tls_env

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


@pytest.fixture(scope="module")
def tls_service(module: str) -> Iterator[RunningService]:
    service = launch_service(module, {**BASE_ENV, **tls_env()})
    yield service
    assert service.stop() == 0


@pytest.fixture(scope="module")
def prebuilt_service(module: str) -> Iterator[RunningService]:
    service = launch_service(module, {**BASE_ENV, "RESPONSE_MODEL": "prebuilt"})
    yield service
    assert service.stop() == 0


# The plaintext services under each response model (RESPONSE_MODEL): build (the default), prebuilt.
PLAINTEXT = {"plaintext": "plain_service", "prebuilt": "prebuilt_service"}


# Both take `module` so that pytest parametrizes them over the servers (getfixturevalue alone hides it).
@pytest.fixture(params=PLAINTEXT.values())
def plaintext(request: pytest.FixtureRequest, module: str) -> RunningService:
    return request.getfixturevalue(request.param)


@pytest.fixture(params=["plaintext", "prebuilt", "tls"])
def channel(request: pytest.FixtureRequest, module: str) -> Iterator[grpc.Channel]:
    if request.param in PLAINTEXT:
        service = request.getfixturevalue(PLAINTEXT[request.param])
        assert not service.tls
        opened = grpc.insecure_channel(target(service))
    else:
        service = request.getfixturevalue("tls_service")
        assert service.tls
        ca = (CERTS / "ca.pem").read_bytes()
        opened = grpc.secure_channel(target(service), grpc.ssl_channel_credentials(root_certificates=ca))
    with opened:
        yield opened


@pytest.fixture(scope="module")
def pool() -> list:
    return generate_pool(POOL_SIZE, SEED)


def test_health_is_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as error:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_service(channel: grpc.Channel, module: str) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {service.name for response in responses for service in response.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names
    if module == "grpc_aio":  # grpclib's reflection lists the services it was given, not itself
        assert "grpc.reflection.v1alpha.ServerReflection" in names
    descriptor = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol(SERVICE)
    methods = {m.name: (m.server_streaming, m.output_type) for m in descriptor.service[0].method}
    assert methods == {
        "ListRecords": (False, ".protolab.cars.v1.ListRecordsResponse"),
        "StreamRecords": (True, ".protolab.cars.v1.Record"),
        "CreateRecords": (False, ".protolab.cars.v1.CreateRecordsReply"),
        "UploadRecords": (False, ".protolab.cars.v1.CreateRecordsReply"),
    }


def test_list_records_count_and_shape(channel: grpc.Channel) -> None:
    stub = cars_pb2_grpc.RecordServiceStub(channel)
    assert len(stub.ListRecords(request(), timeout=5).records) == 100  # absent count: DEFAULT_COUNT
    records = stub.ListRecords(request(count=MAX_COUNT, offset=0), timeout=5).records
    assert len(records) == MAX_COUNT
    for record in records:
        car, driver = record.car, record.driver
        assert car.make and car.model and car.trim and car.color
        assert 1995 <= car.year <= 2026 and 0 <= car.mileage <= 300_000
        assert driver.firstname and driver.lastname and driver.driver_id.startswith("DRV-")


@pytest.mark.parametrize(
    ("count", "offset"), [(1, 0), (100, 1234), (50, POOL_SIZE - 10), (7, 3 * POOL_SIZE + 5)]
)
def test_stream_yields_the_records_of_list(channel: grpc.Channel, count: int, offset: int) -> None:
    stub = cars_pb2_grpc.RecordServiceStub(channel)
    unary = stub.ListRecords(request(count, offset), timeout=5)
    streamed = list(stub.StreamRecords(request(count, offset), timeout=5))
    assert len(streamed) == count
    assert streamed == list(unary.records)


@pytest.mark.parametrize(
    ("count", "offset"),
    [
        (1, 0),
        (100, 0),
        (100, 1234),
        (50, POOL_SIZE - 10),
        (MAX_COUNT, POOL_SIZE - 500),
        (3, 2 * POOL_SIZE + 1),
    ],
)
def test_responses_equal_the_pool(channel: grpc.Channel, pool: list, count: int, offset: int) -> None:
    stub = cars_pb2_grpc.RecordServiceStub(channel)
    expected = expected_response(pool, count, offset)
    assert stub.ListRecords(request(count, offset), timeout=5) == expected
    streamed = cars_pb2.ListRecordsResponse(records=stub.StreamRecords(request(count, offset), timeout=5))
    assert streamed == expected


def test_without_offset_the_server_rotates_through_the_pool(plaintext: RunningService, pool: list) -> None:
    pool_records = list(expected_response(pool, POOL_SIZE, 0).records)
    with grpc.insecure_channel(target(plaintext)) as opened:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        first = stub.ListRecords(request(count=7), timeout=5).records
        second = stub.ListRecords(request(count=7), timeout=5).records
    start = pool_records.index(first[0])
    assert list(first) == [pool_records[(start + i) % POOL_SIZE] for i in range(7)]
    assert list(second) == [pool_records[(start + 7 + i) % POOL_SIZE] for i in range(7)]


@pytest.mark.parametrize("model", ["build", "prebuilt"])
def test_every_window_of_a_small_pool(
    start_service: Callable[..., RunningService], module: str, model: str
) -> None:
    # MAX_COUNT 5 on a 10-record pool: every (count, offset), twice, wrapping around the pool's end.
    env = {"RECORD_POOL_SIZE": "10", "RECORD_SEED": str(SEED), "MAX_COUNT": "5", "DEFAULT_COUNT": "5"}
    service = start_service(module, {**env, "RESPONSE_MODEL": model})
    small_pool = generate_pool(10, SEED)
    with grpc.insecure_channel(target(service)) as opened:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        for _ in range(2):
            for count in range(1, 6):
                for offset in range(10):
                    expected = expected_response(small_pool, count, offset)
                    assert stub.ListRecords(request(count, offset), timeout=5) == expected
                    streamed = stub.StreamRecords(request(count, offset), timeout=5)
                    assert list(streamed) == list(expected.records)


def test_live_mode_generates_records_per_call(
    start_service: Callable[..., RunningService], module: str
) -> None:
    service = start_service(module, {"RECORD_MODE": "live", "METRICS_ENABLED": "0"})
    with grpc.insecure_channel(target(service)) as opened:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        first = stub.ListRecords(request(count=5, offset=0), timeout=5)
        second = stub.ListRecords(request(count=5, offset=0), timeout=5)
        streamed = list(stub.StreamRecords(request(count=3), timeout=5))
    assert len(first.records) == 5 and len(streamed) == 3
    assert first != second  # fresh Faker records, not the pool
    assert all(record.driver.driver_id.startswith("DRV-") for record in [*first.records, *streamed])
    # METRICS_ENABLED=0: no wrapped methods, so no gRPC series (the supervisor still serves the rest).
    assert not any(name.startswith("grpc_server_") for name, _ in scrape(service))


@pytest.mark.parametrize(
    ("count", "offset", "message"),
    [
        (0, None, f"count must be between 1 and {MAX_COUNT}, got 0"),
        (-5, 0, f"count must be between 1 and {MAX_COUNT}, got -5"),
        (MAX_COUNT + 1, None, f"count must be between 1 and {MAX_COUNT}, got {MAX_COUNT + 1}"),
        (10, -1, "offset must be >= 0, got -1"),
    ],
)
def test_bad_input_is_invalid_argument(
    plain_service: RunningService, count: int, offset: int | None, message: str
) -> None:
    with grpc.insecure_channel(target(plain_service)) as opened:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        with pytest.raises(grpc.RpcError) as unary:
            stub.ListRecords(request(count, offset), timeout=5)
        with pytest.raises(grpc.RpcError) as stream:
            list(stub.StreamRecords(request(count, offset), timeout=5))
        for error in (unary.value, stream.value):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details() == message
        assert len(stub.ListRecords(request(count=3), timeout=5).records) == 3


def test_undecodable_requests_fail_and_the_server_keeps_serving(plain_service: RunningService) -> None:
    with grpc.insecure_channel(target(plain_service)) as opened:
        # No serializers: the bytes go on the wire as they are (0xff is no valid field tag).
        raw_unary = opened.unary_unary(f"/{SERVICE}/ListRecords")
        raw_stream = opened.unary_stream(f"/{SERVICE}/StreamRecords")
        for call in (
            lambda: raw_unary(b"\xff\xff\xff", timeout=5),
            lambda: list(raw_stream(b"\xff", timeout=5)),
        ):
            with pytest.raises(grpc.RpcError) as error:
                call()
            # Bytes the client can send are bad input, INVALID_ARGUMENT on both servers (issue 37):
            # never grpc.aio's own UNKNOWN for a deserializer that raises.
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details() == "not a valid protolab.cars.v1.ListRecordsRequest message"
        with pytest.raises(grpc.RpcError) as error:
            opened.unary_unary(f"/{SERVICE}/NoSuchMethod")(b"", timeout=5)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        assert len(stub.ListRecords(request(count=2), timeout=5).records) == 2


def test_a_single_worker_refuses_a_busy_port(
    start_service: Callable[..., RunningService], module: str
) -> None:
    # The two workers of the first service share their port with SO_REUSEPORT; grpc's default
    # (reuse-port on) would let the second service join them silently instead of failing.
    sharing = start_service(module, {**BASE_ENV, "WORKERS": "2"})
    with pytest.raises(AssertionError, match="did not print its listening line"):
        start_service(module, {**BASE_ENV, "PORT": str(sharing.port)})


# --- equal work across protocols


def test_rest_bodies_equal_grpc_messages(start_service: Callable[..., RunningService], pool: list) -> None:
    # Every gRPC server and every REST server, in one test: all must give the same records.
    grpc_services = [start_service(name, BASE_ENV) for name in GRPC_SERVERS]
    rest_services = [start_service(name, BASE_ENV) for name in REST_SERVERS]
    cases = [(1, 0), (100, 0), (100, 777), (20, POOL_SIZE - 5), (MAX_COUNT, POOL_SIZE - 300)]
    for grpc_service in grpc_services:
        _equal_records(grpc_service, rest_services, pool, cases)


def _equal_records(
    grpc_service: RunningService,
    rest_services: list[RunningService],
    pool: list,
    cases: list[tuple[int, int]],
) -> None:
    with grpc.insecure_channel(target(grpc_service)) as opened, httpx.Client(timeout=10) as http:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        for count, offset in cases:
            unary = stub.ListRecords(request(count, offset), timeout=5)
            streamed = cars_pb2.ListRecordsResponse(
                records=stub.StreamRecords(request(count, offset), timeout=5)
            )
            assert unary == streamed == expected_response(pool, count, offset)
            for rest in rest_services:
                url = f"http://127.0.0.1:{rest.port}/records"
                response = http.get(url, params={"count": count, "offset": offset})
                assert response.status_code == 200
                assert json_format.Parse(response.content, cars_pb2.ListRecordsResponse()) == unary
