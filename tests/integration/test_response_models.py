"""Both response models on every server over real sockets: each states its model in its listening
line, and all return the same records for the same request, REST and gRPC alike."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import orjson
import pytest
from google.protobuf import json_format

from services.common.config import ResponseModel
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import generate_pool
from tests.support import GRPC_SERVERS, REST_SERVERS, ROOT

POOL_SIZE = 2000
SEED = 42
MAX_COUNT = 1000
ENV = {
    "PORT": "0",
    "METRICS_PORT": "0",
    "WORKERS": "1",
    "SHUTDOWN_DRAIN_SECONDS": "0",
    "RECORD_POOL_SIZE": str(POOL_SIZE),
    "RECORD_SEED": str(SEED),
    "MAX_COUNT": str(MAX_COUNT),
}
SERVERS = (*REST_SERVERS, *GRPC_SERVERS)

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


@dataclass
class Started:
    process: subprocess.Popen[str]
    listening: dict[str, Any]  # the service's listening line


def start(module: str, model: ResponseModel) -> Started:
    """python -m services.<module> under the model; its first stdout line is its listening line."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"services.{module}"],
        cwd=ROOT,
        env={**os.environ, **ENV, "RESPONSE_MODEL": model.value},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"services.{module} exited ({process.wait()}) without its listening line"
    return Started(process, json.loads(line))


@pytest.fixture(scope="module")
def services() -> Iterator[dict[tuple[str, ResponseModel], Started]]:
    started: dict[tuple[str, ResponseModel], Started] = {}
    try:
        for module in SERVERS:
            for model in ResponseModel:
                started[module, model] = start(module, model)
        yield started
    finally:
        for service in started.values():
            service.process.send_signal(signal.SIGTERM)
        codes = [service.process.wait(timeout=20) for service in started.values()]
    assert set(codes) == {0}, codes


@pytest.mark.parametrize("model", list(ResponseModel))
@pytest.mark.parametrize("module", SERVERS)
def test_the_listening_line_states_the_response_model(services, module, model) -> None:
    listening = services[module, model].listening
    assert listening["event"] == "listening" and listening["service"] == module
    assert listening["response_model"] == model.value
    assert {"port", "metrics_port", "workers", "tls"} <= set(listening)
    assert listening["interpreter"]["executable"] == os.path.realpath(sys.executable)
    assert listening["interpreter"]["gc"] == "freeze"  # the start-up heap out of collections (GC_FREEZE)


@pytest.mark.parametrize(("count", "offset"), [(1, 0), (7, POOL_SIZE - 3), (MAX_COUNT, 123)])
def test_both_models_return_the_same_records_on_every_server(services, count, offset) -> None:
    pool = generate_pool(POOL_SIZE, SEED)
    expected_body = orjson.dumps({"records": [pool[(offset + i) % POOL_SIZE] for i in range(count)]})
    expected = json_format.Parse(expected_body, cars_pb2.ListRecordsResponse())
    params = {"count": count, "offset": offset}
    call = cars_pb2.ListRecordsRequest(count=count, offset=offset)
    for model in ResponseModel:
        for module in REST_SERVERS:
            url = f"http://127.0.0.1:{services[module, model].listening['port']}/records"
            assert httpx.get(url, params=params, trust_env=False).content == expected_body, (module, model)
        for module in GRPC_SERVERS:
            with grpc.insecure_channel(f"127.0.0.1:{services[module, model].listening['port']}") as channel:
                stub = cars_pb2_grpc.RecordServiceStub(channel)
                assert stub.ListRecords(call, timeout=10) == expected, (module, model)
                assert list(stub.StreamRecords(call, timeout=10)) == list(expected.records), (module, model)
