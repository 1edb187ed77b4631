"""The floor servers (benchmarks/floor/) as the runner starts them: every floor target of matrix.toml in
both response models passes the runner's health wait and verification, and returns the lab's records."""

from collections.abc import Iterator
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
from services.common.records import load_pool
from tests.support import CERTS, FLOOR_TARGETS, ROOT

# The runner's defaults (the floor targets set none): pool size, seed and count bounds.
POOL_SIZE, SEED, MAX_COUNT = 10_000, 42, 1000
# The first records, a run that wraps around the pool, and the largest response.
REQUESTS = ((1, 0), (7, POOL_SIZE - 3), (MAX_COUNT, 123))

pytestmark = pytest.mark.timeout(300)


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


@pytest.mark.parametrize("target", ["floor-aiohttp-h1", "floor-grpc"])
def test_a_floor_refuses_what_the_contract_refuses(backend: LocalBackend, target: str) -> None:
    scenario = next(s for s in _scenarios() if s.target.name == target)
    handle = backend.start_service(scenario)
    try:
        wait_healthy(backend, handle, scenario.target, CERTS / "ca.pem", timeout_s=30)
        if scenario.target.is_grpc:
            with grpc.insecure_channel(str(handle.address)) as channel:
                stub = cars_pb2_grpc.RecordServiceStub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ListRecords(cars_pb2.ListRecordsRequest(count=MAX_COUNT + 1), timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        else:
            url = f"http://{handle.address}/records"
            for params in ({"count": MAX_COUNT + 1}, {"count": "ten"}, {"offset": -1}):
                response = httpx.get(url, params=params, trust_env=False)
                assert response.status_code == 400 and response.json()["status"] == 400, params
    finally:
        backend.stop_service(handle)
