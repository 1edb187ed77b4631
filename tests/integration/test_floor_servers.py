"""The floor servers (benchmarks/floor/) as the runner starts them: every floor target of matrix.toml in
both response models passes the runner's health wait and verification, and returns the lab's records;
and each floor next to its lab server: the same answers to bad input and the same bytes on the wire."""

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from google.protobuf import json_format
from labrunner.backends.base import BackendSettings, ServiceHandle
from labrunner.backends.local import LocalBackend
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.run.service_checks import verify, wait_healthy

from services.common.config import ResponseModel
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.pool import load_pool
from tests.support import (
    CERTS,
    FLOOR_TARGETS,
    GRPC_SERVERS,
    REST_SERVERS,
    ROOT,
    RunningService,
    launch_service,
)

# The runner's defaults (the floor targets set none): pool size, seed and count bounds.
POOL_SIZE, SEED, MAX_COUNT = 10_000, 42, 1000
# The first records, a run that wraps around the pool, and the largest response.
REQUESTS = ((1, 0), (7, POOL_SIZE - 3), (MAX_COUNT, 123))

# Servers under the p1 profile's CPU quota, no figure judged.
pytestmark = [pytest.mark.timeout(300), pytest.mark.paired]


def _scenarios() -> list[Scenario]:
    """The floor preset's floor scenarios of the first repeat, one per target and response model."""
    # p1: two workers sharing the port, the path a quota above one CPU takes.
    overrides = Overrides(targets=FLOOR_TARGETS, profiles=("p1",), repeats=1)
    return list(expand(load_matrix(ROOT / "matrix.toml"), "local", "floor", overrides).scenarios)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    logs = tmp_path_factory.mktemp("floor-logs")
    settings = BackendSettings("floor-test", ROOT, CERTS, logs, Path("k6"), 60.0, 20.0)
    local = LocalBackend(settings)
    yield local
    local.close()


@pytest.fixture(scope="module")
def expected() -> dict[tuple[int, int], bytes]:
    """The REST body of each request, from the pool every lab server serves."""
    pool = load_pool(POOL_SIZE, SEED)
    return {
        (count, offset): orjson.dumps({"records": [pool[(offset + i) % POOL_SIZE] for i in range(count)]})
        for count, offset in REQUESTS
    }


def test_the_floor_preset_runs_every_floor_in_both_models() -> None:
    assert {(s.target.name, s.response_model) for s in _scenarios()} == {
        (target, model) for target in FLOOR_TARGETS for model in ResponseModel
    }


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s.id)
def test_a_floor_passes_the_runners_checks_and_returns_the_lab_records(
    backend: LocalBackend, scenario: Scenario, expected: dict[tuple[int, int], bytes]
) -> None:
    # start_service checks the listening line: cleartext and the scenario's response model.
    handle = backend.start_service(scenario)
    try:
        assert (handle.metrics_address, handle.prometheus_target) == (None, None)  # a floor has no metrics
        assert handle.workers == 2
        wait_healthy(backend, handle, scenario.target, CERTS / "ca.pem", timeout_s=30)
        verification = verify(handle, scenario, CERTS / "ca.pem")
        assert verification.ok, verification.failures
        assert verification.protocol == ("grpc" if scenario.target.is_grpc else "HTTP/1.1")
        _assert_lab_records(handle, scenario, expected)
    finally:
        usage = backend.stop_service(handle)
    assert usage.exit_code == 0, usage.log_tail


def _assert_lab_records(
    handle: ServiceHandle, scenario: Scenario, expected: dict[tuple[int, int], bytes]
) -> None:
    """The same bytes (REST) or messages (gRPC, unary and streamed) as the lab's servers for each request."""
    if not scenario.target.is_grpc:
        for (count, offset), body in expected.items():
            url = f"http://{handle.address}/records"
            response = httpx.get(url, params={"count": count, "offset": offset}, trust_env=False)
            assert (response.status_code, response.content) == (200, body), (count, offset)
        return
    with grpc.insecure_channel(str(handle.address)) as channel:
        stub = cars_pb2_grpc.RecordServiceStub(channel)
        for (count, offset), body in expected.items():
            want = json_format.Parse(body, cars_pb2.ListRecordsResponse())
            call = cars_pb2.ListRecordsRequest(count=count, offset=offset)
            assert stub.ListRecords(call, timeout=10) == want, (count, offset)
            assert list(stub.StreamRecords(call, timeout=10)) == list(want.records), (count, offset)


# Each floor next to its lab server, started alike (one worker, the runner's pool): the floor modules
# have the lab's names (benchmarks.floor.rest_aiohttp is rest_aiohttp's floor, ...).
PAIRS = [(stack, model) for stack in (*REST_SERVERS, *GRPC_SERVERS) for model in ResponseModel]
RECORD_SERVICE = "/protolab.cars.v1.RecordService"


@pytest.fixture(scope="module", params=PAIRS, ids=lambda pair: f"{pair[0]}-{pair[1]}")
def lab_and_floor(request: pytest.FixtureRequest) -> Iterator[tuple[str, RunningService, RunningService]]:
    stack, model = request.param
    env = {"RECORD_POOL_SIZE": str(POOL_SIZE), "RECORD_SEED": str(SEED), "RESPONSE_MODEL": str(model)}
    lab = launch_service(stack, env)
    try:
        floor = launch_service(stack, env, package="benchmarks.floor")
        try:
            yield stack, lab, floor
        finally:
            assert floor.stop() == 0
    finally:
        assert lab.stop() == 0


# What a client may get wrong, with the status the lab answers it (so equal answers are not equally
# broken ones): a count or offset out of the contract, a path nobody serves, a method a route does not.
REST_BAD_INPUTS: tuple[tuple[str, str, dict[str, str | int], int], ...] = (
    ("GET", "/records", {"count": MAX_COUNT + 1}, 400),
    ("GET", "/records", {"count": 0}, 400),
    ("GET", "/records", {"count": "ten"}, 400),
    ("GET", "/records", {"count": " 7"}, 400),
    ("GET", "/records", {"offset": -1}, 400),
    ("GET", "/nowhere", {}, 404),
    ("GET", "/records/1", {}, 404),
    ("PUT", "/records", {}, 405),
    ("DELETE", "/records", {}, 405),
    ("OPTIONS", "/records", {}, 405),
    ("POST", "/healthz", {}, 405),
)
# (method, request bytes, the code the lab answers): out of the contract, undecodable, not a method.
INVALID = grpc.StatusCode.INVALID_ARGUMENT
GRPC_BAD_INPUTS: tuple[tuple[str, bytes, grpc.StatusCode], ...] = (
    ("ListRecords", cars_pb2.ListRecordsRequest(count=MAX_COUNT + 1).SerializeToString(), INVALID),
    ("ListRecords", cars_pb2.ListRecordsRequest(count=0).SerializeToString(), INVALID),
    ("ListRecords", cars_pb2.ListRecordsRequest(offset=-1).SerializeToString(), INVALID),
    ("ListRecords", b"\xff\xff\xff", INVALID),
    ("StreamRecords", cars_pb2.ListRecordsRequest(count=MAX_COUNT + 1).SerializeToString(), INVALID),
    ("StreamRecords", cars_pb2.ListRecordsRequest(offset=-1).SerializeToString(), INVALID),
    ("StreamRecords", b"\xff", INVALID),
    ("NoSuchMethod", b"", grpc.StatusCode.UNIMPLEMENTED),
)


def _rest_answer(
    service: RunningService, method: str, path: str, params: dict[str, str | int]
) -> tuple[int, bytes, set[str]]:
    """Status, body bytes and the methods Allow lists (in no fixed order: Quart's comes from a set)."""
    url = f"http://127.0.0.1:{service.port}{path}"
    response = httpx.request(method, url, params=params, trust_env=False, timeout=10)
    allowed = {m.strip() for m in response.headers.get("allow", "").split(",") if m.strip()}
    return response.status_code, response.content, allowed


def _grpc_answer(service: RunningService, method: str, request: bytes) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call whose request goes on the wire as these bytes."""
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        call: Callable[[], object]
        if method == "StreamRecords":
            streamed = channel.unary_stream(f"{RECORD_SERVICE}/{method}")
            call = lambda: list(streamed(request, timeout=10))  # noqa: E731
        else:
            call = lambda: channel.unary_unary(f"{RECORD_SERVICE}/{method}")(request, timeout=10)  # noqa: E731
        with pytest.raises(grpc.RpcError) as refused:
            call()
    error: grpc.Call = refused.value  # type: ignore[assignment]
    return error.code(), error.details() or ""


def test_a_floor_refuses_bad_input_as_its_lab_server(
    lab_and_floor: tuple[str, RunningService, RunningService],
) -> None:
    stack, lab, floor = lab_and_floor
    if stack in REST_SERVERS:
        for method, path, params, status in REST_BAD_INPUTS:
            answer = _rest_answer(lab, method, path, params)
            assert answer[0] == status, (method, path, params, answer)
            assert orjson.loads(answer[1])["status"] == status  # the lab's JSON error body
            assert _rest_answer(floor, method, path, params) == answer, (method, path, params)
        return
    for method, request, code in GRPC_BAD_INPUTS:
        answer = _grpc_answer(lab, method, request)
        assert answer[0] == code, (method, request, answer)
        assert _grpc_answer(floor, method, request) == answer, (method, request)


def _grpc_bytes(service: RunningService, count: int, offset: int) -> tuple[bytes, list[bytes]]:
    """ListRecords' response and StreamRecords' messages as the bytes on the wire (no deserializer)."""
    request = cars_pb2.ListRecordsRequest(count=count, offset=offset).SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        unary = channel.unary_unary(f"{RECORD_SERVICE}/ListRecords")(request, timeout=10)
        streamed = list(channel.unary_stream(f"{RECORD_SERVICE}/StreamRecords")(request, timeout=10))
    assert isinstance(unary, bytes)
    return unary, streamed


def test_a_floor_sends_its_lab_servers_bytes(
    lab_and_floor: tuple[str, RunningService, RunningService],
) -> None:
    """Byte for byte, not only equal records: the same JSON body (key order, separators, escapes) or the
    same serialized messages, unary and streamed, for each (count, offset), in the pair's response model."""
    stack, lab, floor = lab_and_floor
    for count, offset in REQUESTS:
        if stack in REST_SERVERS:
            params = {"count": count, "offset": offset}
            want = _rest_answer(lab, "GET", "/records", params)
            assert want[0] == 200 and len(orjson.loads(want[1])["records"]) == count
            assert _rest_answer(floor, "GET", "/records", params) == want, (count, offset)
        else:
            unary, streamed = _grpc_bytes(lab, count, offset)
            assert len(cars_pb2.ListRecordsResponse.FromString(unary).records) == len(streamed) == count
            assert _grpc_bytes(floor, count, offset) == (unary, streamed), (count, offset)
