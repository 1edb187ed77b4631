"""What the gRPC service tests (tests/integration/test_grpc_*.py) share: the record pool's settings,
requests, a server's address, the contract's expected response, channel options, a scrape of its
metrics.
"""

import urllib.request

from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from services.common.pb import cars_pb2
from tests.support import RunningService

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


def request(count: int | None = None, offset: int | None = None) -> cars_pb2.ListRecordsRequest:
    return cars_pb2.ListRecordsRequest(count=count, offset=offset)


def target(service: RunningService) -> str:
    return f"127.0.0.1:{service.port}"


def expected_response(pool: list, count: int, offset: int) -> cars_pb2.ListRecordsResponse:
    """The contract, independent of any server: record i is pool[(offset + i) % pool_size]."""
    body = {"records": [pool[(offset + i) % len(pool)] for i in range(count)]}
    return json_format.ParseDict(body, cars_pb2.ListRecordsResponse())


# A scrape of a server's /metrics: (name, labels) -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(service: RunningService) -> Samples:
    url = f"http://127.0.0.1:{service.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
