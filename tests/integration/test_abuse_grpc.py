"""The abuse suite's gRPC cases, on both gRPC servers and both gRPC floors, each in its cgroup at the small
profile's limits: uploads far past MAX_REQUEST_BYTES in total, a declared message length of 4 GiB, a
message cut short by the end of its stream, the compressed flag without an encoding, and undecodable
bytes. Each answer is a named status (never UNKNOWN, never a dropped connection), the memory peak stays
under the limit, and the server serves a normal call afterwards (docs/guarantees.md)."""

import concurrent.futures
from collections.abc import Iterator

import grpc
import pytest

from services.common.pb import cars_pb2, cars_pb2_grpc
from tests.integration.abuse_support import (
    GRPC_MODULES,
    MEMORY_BYTES,
    Confined,
    RawH2,
    confined,
    ids,
    implementations,
)

SERVICE = "/protolab.cars.v1.RecordService"
MAX_REQUEST_BYTES = 1 << 20  # MAX_REQUEST_BYTES' default (services/common/config.py)
IMPLEMENTATIONS = implementations(GRPC_MODULES)
UPLOADS_AT_ONCE = 3
MESSAGES_PER_UPLOAD = 1000  # the case: ~1 GB a call if nothing bounded the total
MESSAGE_BYTES = 1_000_000  # under the per-message limit, so only the call's total can refuse it

pytestmark = [pytest.mark.timeout(180), pytest.mark.paired]  # servers under CPU quotas, no figure judged


@pytest.fixture(scope="module", params=IMPLEMENTATIONS, ids=ids(IMPLEMENTATIONS))
def server(request: pytest.FixtureRequest) -> Iterator[Confined]:
    package, module = request.param
    with confined(package, module) as started:
        yield started


@pytest.fixture
def abused(server: Confined) -> Iterator[Confined]:
    """The server with its memory peak reset; afterwards alive, under its limit and serving."""
    server.reset_peak()
    yield server
    print(f"\nmemory peak {server.unharmed() / 2**20:.0f} MiB of {MEMORY_BYTES / 2**20:.0f} MiB")
    with grpc.insecure_channel(f"127.0.0.1:{server.service.port}") as channel:
        reply = cars_pb2_grpc.RecordServiceStub(channel).ListRecords(
            cars_pb2.ListRecordsRequest(count=2), timeout=10
        )
    assert len(reply.records) == 2


def _large_records() -> Iterator[cars_pb2.Record]:
    record = cars_pb2.Record(car=cars_pb2.Car(make="m" * (MESSAGE_BYTES - 10)))
    for _ in range(MESSAGES_PER_UPLOAD):
        yield record


def test_uploads_past_the_total_are_resource_exhausted(abused: Confined) -> None:
    def upload() -> tuple[grpc.StatusCode, str]:
        with grpc.insecure_channel(f"127.0.0.1:{abused.service.port}") as channel:
            try:
                cars_pb2_grpc.RecordServiceStub(channel).UploadRecords(_large_records(), timeout=60)
            except grpc.RpcError as error:
                return error.code(), error.details()
        return grpc.StatusCode.OK, ""

    with concurrent.futures.ThreadPoolExecutor(UPLOADS_AT_ONCE) as pool:
        answers = list(pool.map(lambda _: upload(), range(UPLOADS_AT_ONCE)))
    print(f"\nanswers {answers}")
    assert {code for code, _ in answers} == {grpc.StatusCode.RESOURCE_EXHAUSTED}, answers


def _raw_call(port: int, method: str, body: bytes, end_stream: bool = True) -> tuple[int | None, str]:
    raw = RawH2(port)
    try:
        raw.grpc_headers(1, f"{SERVICE}/{method}", port)
        raw.conn.send_data(1, body, end_stream=end_stream)
        raw.flush()
        return raw.grpc_status(1)
    finally:
        raw.close()


# (case, method, the DATA frame's bytes, whether the client ends its stream, the statuses allowed). Each
# call has a 3 s deadline: grpc core waits for the rest of a message cut short until the deadline.
RAW_CASES = {
    "declared length of 4 GiB": (
        "UploadRecords", b"\x00\xff\xff\xff\xff" + b"x" * 10, False, {grpc.StatusCode.RESOURCE_EXHAUSTED},
    ),
    "message cut short by the end of the stream": (
        "ListRecords", b"\x00\x00\x00\x00\x09\x08", True,
        {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED},
    ),
    "prefix cut short by the end of the stream": (
        "ListRecords", b"\x00\x00\x00", True,
        {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED},
    ),
    "compressed flag without an encoding": (
        "ListRecords", b"\x01\x00\x00\x00\x02\x08\x05", True,
        {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL},
    ),
    "undecodable bytes": (
        "ListRecords", b"\x00\x00\x00\x00\x03\xff\xff\xff", True, {grpc.StatusCode.INVALID_ARGUMENT},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RAW_CASES))
def test_what_a_client_sends_ends_in_a_named_status(abused: Confined, case: str) -> None:
    method, body, end_stream, allowed = RAW_CASES[case]
    status, message = _raw_call(abused.service.port, method, body, end_stream)
    print(f"\n{case}: grpc-status {status} {message!r}")
    assert status is not None, message
    assert grpc.StatusCode(next(code for code in grpc.StatusCode if code.value[0] == status)) in allowed, (
        status,
        message,
    )
