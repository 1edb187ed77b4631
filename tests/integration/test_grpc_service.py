"""Every gRPC service (grpc.aio, grpclib) over real sockets: contract, equal work, bad input, metrics,
shutdown and limits."""

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import grpc.aio
import httpx
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from labrunner.backends.cgroups import CgroupUnavailable, create_cgroup, join_cgroup, remove_cgroup
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics import LATENCY_BUCKETS_SECONDS, MetricBatch
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import generate_pool
from services.grpc_aio.metrics import instrument_servicer
from tests.support import CERTS, GRPC_SERVERS, REST_SERVERS, RunningService, launch_service, tls_env

SERVICE = "protolab.cars.v1.RecordService"
POOL_SIZE = 2000
SEED = 42
MAX_COUNT = 1000
BASE_ENV = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), "MAX_COUNT": str(MAX_COUNT)}
# A stream long enough (2 MB) to keep a server busy for a while.
SLOW_COUNT = 20_000
SLOW_ENV = {**BASE_ENV, "MAX_COUNT": str(SLOW_COUNT)}
# Each channel its own connection; grpc otherwise shares one between equal channels.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
# Flow-control windows that stay small while the client does not read. A grpc client's BDP probing
# otherwise grows them past 5 MB: a server fast enough then sends a whole stream into them before the
# client's deadline, and rightly counts it OK (issue 22: grpclib on a fast host). With these windows
# a stream stalls within some KB, however fast its server.
SMALL_WINDOWS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
# Far more than those windows take in a second, yet short enough that a server sends all of it
# within the 0.5 s deadline below if the windows do not hold it.
HELD_COUNT = 2_000
UNARY = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": "ListRecords"}
STREAM = {"grpc_type": "server_stream", "grpc_service": SERVICE, "grpc_method": "StreamRecords"}
# go-grpc-prometheus writes Go's codes.Code.String().
GO_CODES = (
    "OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
    "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
)  # fmt: skip

pytestmark = pytest.mark.timeout(120)


def request(count: int | None = None, offset: int | None = None) -> cars_pb2.ListRecordsRequest:
    return cars_pb2.ListRecordsRequest(count=count, offset=offset)


def target(service: RunningService) -> str:
    return f"127.0.0.1:{service.port}"


def expected_response(pool: list, count: int, offset: int) -> cars_pb2.ListRecordsResponse:
    """The contract, independent of any server: record i is pool[(offset + i) % pool_size]."""
    body = {"records": [pool[(offset + i) % len(pool)] for i in range(count)]}
    return json_format.ParseDict(body, cars_pb2.ListRecordsResponse())


# --- shared servers for the read-only tests


@pytest.fixture(scope="module", params=GRPC_SERVERS)
def module(request: pytest.FixtureRequest) -> str:
    """The gRPC server under test: every test that uses it (or the servers below) runs on each."""
    return str(request.param)


@pytest.fixture(scope="module")
def plain_service(module: str) -> Iterator[RunningService]:
    service = launch_service(module, BASE_ENV)
    yield service
    assert service.stop() == 0


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
            # grpc.aio reports a request its deserializer rejects as UNKNOWN (grpc-go says INTERNAL);
            # grpclib's codec here answers the same.
            assert error.value.code() == grpc.StatusCode.UNKNOWN
            assert "Error parsing message" in error.value.details()
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


# --- metrics


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(service: RunningService) -> Samples:
    url = f"http://127.0.0.1:{service.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(name: str, labels: dict[str, str], **extra: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({**labels, **extra}.items())


def handled_total(samples: Samples, labels: dict[str, str]) -> float:
    return sum(samples[series("grpc_server_handled_total", labels, grpc_code=code)] for code in GO_CODES)


def scrape_until(service: RunningService, done: Callable[[Samples], bool], timeout: float = 10) -> Samples:
    """Workers write their counts every FLUSH_SECONDS, after the client has its answer; poll for that gap."""
    deadline = time.monotonic() + timeout
    samples = scrape(service)
    while not done(samples) and time.monotonic() < deadline:
        time.sleep(0.05)
        samples = scrape(service)
    return samples


def settled(unary: int, stream: int) -> Callable[[Samples], bool]:
    """Done when this many calls of each kind were started and every started call was handled and
    timed. A worker flushes its batched series one after another, so a scrape during a flush can
    see a call handled but not yet in the histogram (seen once in CI, on a busy host)."""

    def done(samples: Samples) -> bool:
        return all(
            samples[series("grpc_server_started_total", labels)]
            == calls
            == handled_total(samples, labels)
            == samples[series("grpc_server_handling_seconds_count", labels)]
            for labels, calls in ((UNARY, unary), (STREAM, stream))
        )

    return done


HELD_ENV = {**BASE_ENV, "MAX_COUNT": str(HELD_COUNT)}


def hold_streams(service: RunningService, times: int = 1) -> None:
    """Streams whose client stops reading: one it cancels, one it lets reach its deadline (times over)."""
    with grpc.insecure_channel(target(service), options=SMALL_WINDOWS) as held:
        stub = cars_pb2_grpc.RecordServiceStub(held)
        for _ in range(times):
            cancelled = stub.StreamRecords(request(count=HELD_COUNT))
            next(cancelled)
            cancelled.cancel()
            expiring = stub.StreamRecords(request(count=HELD_COUNT), timeout=0.5)
            next(expiring)
            time.sleep(1)
            with pytest.raises(grpc.RpcError) as error:
                list(expiring)
            assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_metrics_move_with_traffic(start_service: Callable[..., RunningService], module: str) -> None:
    service = start_service(module, HELD_ENV)
    before = scrape(service)
    for labels in (UNARY, STREAM):  # every series exists from start-up, at 0
        for name in (
            "grpc_server_started_total",
            "grpc_server_msg_received_total",
            "grpc_server_msg_sent_total",
        ):
            assert before[series(name, labels)] == 0
        assert handled_total(before, labels) == 0
        assert before[series("grpc_server_handling_seconds_count", labels)] == 0

    with grpc.insecure_channel(target(service)) as opened:
        health = health_pb2_grpc.HealthStub(opened)
        for _ in range(3):
            health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        for _ in range(5):
            stub.ListRecords(request(count=10), timeout=5)
        for _ in range(3):
            assert len(list(stub.StreamRecords(request(count=7), timeout=5))) == 7
        for bad in (request(count=0), request(offset=-1)):
            with pytest.raises(grpc.RpcError):
                stub.ListRecords(bad, timeout=5)
        with pytest.raises(grpc.RpcError):
            list(stub.StreamRecords(request(count=0), timeout=5))

        after = scrape_until(service, settled(unary=7, stream=4))
        value = after.__getitem__
        assert value(series("grpc_server_started_total", UNARY)) == 7
        assert value(series("grpc_server_msg_received_total", UNARY)) == 7
        assert value(series("grpc_server_handled_total", UNARY, grpc_code="OK")) == 5
        assert value(series("grpc_server_handled_total", UNARY, grpc_code="InvalidArgument")) == 2
        assert value(series("grpc_server_msg_sent_total", UNARY)) == 5
        assert value(series("grpc_server_started_total", STREAM)) == 4
        assert value(series("grpc_server_msg_received_total", STREAM)) == 4
        assert value(series("grpc_server_handled_total", STREAM, grpc_code="OK")) == 3
        assert value(series("grpc_server_handled_total", STREAM, grpc_code="InvalidArgument")) == 1
        assert value(series("grpc_server_msg_sent_total", STREAM)) == 3 * 7
        for labels, calls in ((UNARY, 7), (STREAM, 4)):
            assert value(series("grpc_server_handling_seconds_count", labels)) == calls
            buckets = [
                value(series("grpc_server_handling_seconds_bucket", labels, le=str(le)))
                for le in LATENCY_BUCKETS_SECONDS
            ]
            assert buckets == sorted(buckets) and buckets[-1] <= calls
            assert value(series("grpc_server_handling_seconds_bucket", labels, le="+Inf")) == calls
            assert value(series("grpc_server_handling_seconds_sum", labels)) > 0
        # Only RecordService is instrumented: health checks leave no series.
        assert not any(dict(labels).get("grpc_service") == "grpc.health.v1.Health" for _, labels in after)

    hold_streams(service)
    final = scrape_until(service, settled(unary=7, stream=6))
    assert final[series("grpc_server_started_total", STREAM)] == 6
    assert final[series("grpc_server_handled_total", STREAM, grpc_code="Canceled")] == 1
    assert final[series("grpc_server_handled_total", STREAM, grpc_code="DeadlineExceeded")] == 1
    sent = final[series("grpc_server_msg_sent_total", STREAM)] - 3 * 7
    assert 2 <= sent < HELD_COUNT  # both sent some; the windows held both well short of the end


def test_a_throttled_server_counts_its_deadlines(module: str) -> None:
    # At 0.1 CPU a server can sit throttled for 90 ms of every 100 ms: its copy of a call's deadline
    # then starts that much after the client's, whose cancel at its own deadline arrives first.
    try:
        cgroup = create_cgroup(f"test-deadline-{os.getpid()}-{time.monotonic_ns()}", 0.1, 512 * 2**20)
    except CgroupUnavailable as exc:
        pytest.fail(f"this test needs a writable cgroup (run as root): {exc}")
    service = launch_service(module, HELD_ENV, preexec_fn=functools.partial(join_cgroup, cgroup))
    try:
        hold_streams(service, times=4)
        final = scrape_until(service, settled(unary=0, stream=8))
    finally:
        service.kill()
        remove_cgroup(cgroup)
    assert final[series("grpc_server_handled_total", STREAM, grpc_code="Canceled")] == 4
    assert final[series("grpc_server_handled_total", STREAM, grpc_code="DeadlineExceeded")] == 4


def test_exact_totals_with_two_workers(
    start_service: Callable[..., RunningService], tmp_path: Path, module: str
) -> None:
    metrics_dir = tmp_path / "metrics"
    service = start_service(
        module, {**BASE_ENV, "WORKERS": "2", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    assert service.workers == 2
    connections = 40
    for _ in range(connections):  # fresh connections, so SO_REUSEPORT spreads them over both workers
        with grpc.insecure_channel(target(service), options=OWN_CONNECTION) as opened:
            stub = cars_pb2_grpc.RecordServiceStub(opened)
            assert len(stub.ListRecords(request(count=3), timeout=5).records) == 3
            assert len(list(stub.StreamRecords(request(count=4), timeout=5))) == 4

    samples = scrape_until(service, settled(unary=connections, stream=connections))
    assert samples[series("protolab_workers", {})] == 2
    for labels, sent in ((UNARY, connections), (STREAM, 4 * connections)):
        assert samples[series("grpc_server_started_total", labels)] == connections
        assert samples[series("grpc_server_handled_total", labels, grpc_code="OK")] == connections
        assert samples[series("grpc_server_msg_received_total", labels)] == connections
        assert samples[series("grpc_server_msg_sent_total", labels)] == sent
        assert samples[series("grpc_server_handling_seconds_count", labels)] == connections

    # Each worker writes its own files (counter_<pid>.db): both served, and they add up.
    per_worker = {}
    for counters in metrics_dir.glob("counter_*.db"):
        alone = tmp_path / counters.stem
        alone.mkdir()
        shutil.copy(counters, alone)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        per_worker[counters.stem] = registry.get_sample_value("grpc_server_started_total", UNARY)
    assert len(per_worker) == 2
    assert all(started > 0 for started in per_worker.values()), per_worker
    assert sum(per_worker.values()) == connections


# --- shutdown and overload


async def _calls_across_sigterm(service: RunningService, drain_seconds: float) -> None:
    """~20 calls in flight at SIGTERM: unary loops until health says NOT_SERVING, and slow streams."""
    address = target(service)
    not_serving = asyncio.Event()
    statuses: list[int] = []
    calls: list[tuple[str, float, float]] = []

    async def watch_health() -> None:
        async with grpc.aio.insecure_channel(address) as opened:
            health = health_pb2_grpc.HealthStub(opened)
            while not not_serving.is_set():
                response = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
                statuses.append(response.status)
                if response.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    not_serving.set()
                await asyncio.sleep(0.02)

    async def unary_loop() -> None:
        async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as opened:
            stub = cars_pb2_grpc.RecordServiceStub(opened)
            while not not_serving.is_set():  # a client stops sending once health says so
                started = time.monotonic()
                response = await stub.ListRecords(request(count=MAX_COUNT, offset=0), timeout=30)
                assert len(response.records) == MAX_COUNT
                calls.append(("unary", started, time.monotonic()))

    async def slow_stream() -> None:
        async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as opened:
            stub = cars_pb2_grpc.RecordServiceStub(opened)
            started = time.monotonic()
            received = 0
            async for _record in stub.StreamRecords(request(count=SLOW_COUNT, offset=0), timeout=30):
                received += 1
                if received == 1:  # stall past the drain, so the server's stop(grace) must wait for us
                    await asyncio.sleep(drain_seconds + 1)
            assert received == SLOW_COUNT
            calls.append(("stream", started, time.monotonic()))

    watcher = asyncio.create_task(watch_health())
    clients = [asyncio.create_task(unary_loop()) for _ in range(16)]
    clients += [asyncio.create_task(slow_stream()) for _ in range(4)]
    await asyncio.sleep(0.5)
    signalled = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    await asyncio.gather(watcher, *clients)  # any failed call raises here

    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING
    in_flight = [kind for kind, started, ended in calls if started < signalled < ended]
    assert len(in_flight) >= 15, in_flight
    streams = [ended for kind, _, ended in calls if kind == "stream"]
    assert len(streams) == 4 and min(streams) > signalled + drain_seconds  # they outlived the drain


def test_sigterm_finishes_in_flight_calls_and_exits_0(
    start_service: Callable[..., RunningService], module: str
) -> None:
    # The watcher shares this process's event loop with 16 clients decoding 1000-record replies:
    # on a loaded 2-CPU CI host it once saw NOT_SERVING more than 1 s late, and a client's next
    # call then met the stopped server. Clients must be given a drain longer than they react in.
    drain_seconds = 3.0
    env = {
        **SLOW_ENV,
        "WORKERS": "2",
        "SHUTDOWN_DRAIN_SECONDS": str(drain_seconds),
        "SHUTDOWN_GRACE_SECONDS": "20",
    }
    service = start_service(module, env)
    asyncio.run(_calls_across_sigterm(service, drain_seconds))
    assert service.process.wait(timeout=30) == 0


async def _concurrent_slow_streams(address: str, streams: int) -> list[grpc.StatusCode]:
    async def slow_stream() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as opened:
            stub = cars_pb2_grpc.RecordServiceStub(opened)
            received = 0
            try:
                async for _record in stub.StreamRecords(request(count=SLOW_COUNT), timeout=30):
                    received += 1
                    if received == 1:  # hold the server's only slot while the others arrive
                        await asyncio.sleep(1)
            except grpc.aio.AioRpcError as error:
                return error.code()
            assert received == SLOW_COUNT
            return grpc.StatusCode.OK

    return await asyncio.gather(*(slow_stream() for _ in range(streams)))


def test_max_concurrent_rpcs_rejects_the_excess(
    start_service: Callable[..., RunningService], module: str
) -> None:
    service = start_service(module, {**SLOW_ENV, "GRPC_MAX_CONCURRENT_RPCS": "1"})
    codes = asyncio.run(_concurrent_slow_streams(target(service), 5))
    assert codes.count(grpc.StatusCode.OK) >= 1
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 1
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    with grpc.insecure_channel(target(service)) as opened:
        stub = cars_pb2_grpc.RecordServiceStub(opened)
        assert len(stub.ListRecords(request(count=5), timeout=5).records) == 5


# Health checks on fresh channels from a thread while the main thread forks children with a
# preexec_fn, as the runner does when it launches k6 and services; run in a fresh interpreter
# that makes the runner's gRPC setting first, and nothing of pytest's.
# With gRPC's fork handlers, about one check a second failed here (and the probe could hang).
FORK_WHILE_PROBING = """
import os, subprocess, sys, threading, time
from labrunner import grpc_fork
grpc_fork.disable_fork_handlers()
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
failures, checks, stop = [], [], threading.Event()
def probe():
    while not stop.is_set():
        try:
            with grpc.insecure_channel(sys.argv[1]) as channel:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            failures.append(error.details())
        checks.append(1)
thread = threading.Thread(target=probe)
thread.start()
end = time.monotonic() + 5
while time.monotonic() < end:
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
stop.set()
thread.join()
print(len(checks), failures[:3])
sys.exit(1 if failures or len(checks) < 50 else 0)
"""


def test_forking_children_does_not_break_the_runners_grpc_connections(
    plain_service: RunningService,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    completed = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_PROBING, target(plain_service)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]


def test_instrument_servicer_refuses_methods_it_cannot_count() -> None:
    async def list_records(_request: object, _context: object) -> None:
        return None

    async def stream_records_not_a_generator(_request: object, _context: object) -> None:
        return None

    servicer = SimpleNamespace(ListRecords=list_records, StreamRecords=stream_records_not_a_generator)
    with pytest.raises(TypeError, match="async generator"):
        instrument_servicer(servicer, cars_pb2.DESCRIPTOR.services_by_name["RecordService"], MetricBatch())
    bidi = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]  # its one method streams both ways
    with pytest.raises(ValueError, match="client-streaming"):
        instrument_servicer(SimpleNamespace(), bidi, MetricBatch())
