"""A service stopped gracefully has written every request it answered to its metrics files.

Workers write their metrics in batches every FLUSH_SECONDS; the requests here end a few
milliseconds before SIGTERM, so it is the flush at the end of serving that writes them.
"""

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.support import GRPC_SERVERS, REST_SERVERS, launch_service

REQUESTS = 20
# The series that count finished requests, per service.
COUNTED = {
    **dict.fromkeys(REST_SERVERS, "http_server_request_duration_seconds_count"),
    **dict.fromkeys(GRPC_SERVERS, "grpc_server_handled_total"),
}

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.parallel]


def send_requests(module: str, port: int) -> None:
    if module in GRPC_SERVERS:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = cars_pb2_grpc.RecordServiceStub(channel)
            for _ in range(REQUESTS):
                stub.ListRecords(cars_pb2.ListRecordsRequest(count=1), timeout=5)
        return
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        for _ in range(REQUESTS):
            assert http.get("/records", params={"count": 1}).status_code == 200


@pytest.mark.parametrize("module", list(COUNTED))
def test_a_graceful_stop_writes_every_answered_request(module: str, tmp_path) -> None:
    metrics_dir = tmp_path / "metrics"
    service = launch_service(module, {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    try:
        send_requests(module, service.port)
    finally:
        assert service.stop() == 0

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    counted = sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == COUNTED[module]
    )
    assert counted == REQUESTS
