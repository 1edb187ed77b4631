"""The report's payload bodies are what the running services send, byte for byte."""

import urllib.request

import grpc
import pytest
from labrunner.report import payload

from services.common.pb import cars_pb2, cars_pb2_grpc

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel


def test_payload_bodies_are_what_the_services_send(start_service) -> None:
    records = payload.pool_records(10)
    rest = start_service("rest_aiohttp")
    url = f"http://127.0.0.1:{rest.port}/records?count=10&offset=0"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == payload.json_body(records)
    service = start_service("grpc_aio")
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = cars_pb2_grpc.RecordServiceStub(channel)
        reply = stub.ListRecords(cars_pb2.ListRecordsRequest(count=10, offset=0), timeout=10)
    assert reply == payload.protobuf_message(records)
