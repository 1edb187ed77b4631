"""Every record shape beside cars (SHAPE) on every lab server and its floor over real sockets: REST
bodies are the pool's records of that shape byte for byte and parse into the very message gRPC's
ListRecords and StreamRecords return; an upload's reply is the shape's checksum on every server, and a
bad one is refused naming its place (REST) or with INVALID_ARGUMENT (gRPC)."""

from collections.abc import Iterator, Sequence

import grpc
import httpx
import orjson
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from services.common.config import ResponseModel
from services.common.pb import cars_pb2
from services.common.pool import SHAPES, generate_pool
from services.common.shapes import shape_kit
from tests.support import GRPC_SERVERS, REST_SERVERS, RunningService, launch_service

POOL_SIZE = 2000
SEED = 42
OTHER_SHAPES = [shape for shape in SHAPES if shape != "cars"]
PACKAGES = ("services", "benchmarks.floor")  # every lab server, and its floor

# Sockets on ephemeral ports, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(180), pytest.mark.parallel]


def _env(shape: str, model: ResponseModel) -> dict[str, str]:
    return {
        "SHAPE": shape,
        "RESPONSE_MODEL": model.value,
        "RECORD_POOL_SIZE": str(POOL_SIZE),
        "RECORD_SEED": str(SEED),
    }


@pytest.fixture
def service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    module, shape, model, package = request.param
    running = launch_service(module, _env(shape, model), package=package)
    try:
        yield running
    finally:
        assert running.stop() == 0


def _expected(shape: str, count: int, offset: int) -> tuple[bytes, Message]:
    pool = generate_pool(POOL_SIZE, SEED, shape)
    body = orjson.dumps({"records": [pool[(offset + i) % POOL_SIZE] for i in range(count)]})
    return body, json_format.Parse(body, shape_kit(shape).list_message())


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _invoke(channel: grpc.Channel, shape: str, method: str, kind: str) -> grpc.UnaryUnaryMultiCallable:
    kit = shape_kit(shape)
    path = f"/{kit.service.full_name}/{method}"
    reply = {
        "ListRecords": kit.list_message,
        "StreamRecords": kit.record_message,
        "CreateRecords": cars_pb2.CreateRecordsReply,
        "UploadRecords": cars_pb2.CreateRecordsReply,
    }[method]
    factory = getattr(channel, kind)
    return factory(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=reply.FromString
    )  # type: ignore[no-any-return]


def _every_shape_on(servers: Sequence[str]) -> list[tuple[str, str, ResponseModel, str]]:
    """(module, shape, response model, package): every shape but cars on each server, lab and floor."""
    return [
        (module, shape, model, package)
        for shape in OTHER_SHAPES
        for module in servers
        for model in ResponseModel
        for package in PACKAGES
    ]


def _joined(params: tuple[object, ...]) -> str:
    return "-".join(str(part) for part in params)


@pytest.mark.parametrize("service", _every_shape_on(REST_SERVERS), indirect=True, ids=_joined)
def test_rest_serves_and_takes_the_shape(service: RunningService, request: pytest.FixtureRequest) -> None:
    module, shape, _, _ = request.node.callspec.params["service"]
    kit = shape_kit(shape)
    base = f"http://127.0.0.1:{service.port}"
    for count, offset in ((1, 0), (7, POOL_SIZE - 3), (1000, 123)):
        body, _ = _expected(shape, count, offset)
        got = httpx.get(f"{base}/records", params={"count": count, "offset": offset}, trust_env=False)
        assert got.status_code == 200 and got.content == body, (module, shape, count, offset)

    records = generate_pool(POOL_SIZE, SEED, shape)[:100]
    upload = httpx.post(
        f"{base}/records",
        content=orjson.dumps({"records": records}),
        headers={"Content-Type": "application/json"},
        trust_env=False,
    )
    expected = kit.checksum([kit.from_json(record) for record in records])
    assert upload.status_code == 200 and upload.json() == {"count": 100, "checksum": expected}

    first = next(iter(records[0]))
    broken = [*records[:3], {**records[3], first: [1]}]
    refused = httpx.post(
        f"{base}/records",
        content=orjson.dumps({"records": broken}),
        headers={"Content-Type": "application/json"},
        trust_env=False,
    )
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(f"records[3].{first}: expected"), refused.json()


@pytest.mark.parametrize("service", _every_shape_on(GRPC_SERVERS), indirect=True, ids=_joined)
def test_grpc_serves_and_takes_the_shape(service: RunningService, request: pytest.FixtureRequest) -> None:
    module, shape, _, _ = request.node.callspec.params["service"]
    kit = shape_kit(shape)
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        list_records = _invoke(channel, shape, "ListRecords", "unary_unary")
        stream_records = _invoke(channel, shape, "StreamRecords", "unary_stream")
        for count, offset in ((1, 0), (7, POOL_SIZE - 3), (1000, 123)):
            _, expected = _expected(shape, count, offset)
            call = cars_pb2.ListRecordsRequest(count=count, offset=offset)
            assert list_records(call, timeout=10) == expected, (module, shape, count, offset)
            streamed = list(stream_records(call, timeout=10))
            assert streamed == list(expected.records), (module, shape)  # type: ignore[attr-defined]

        records = generate_pool(POOL_SIZE, SEED, shape)[:100]
        create = json_format.Parse(orjson.dumps({"records": records}), kit.create_message())
        checksum = kit.checksum([kit.from_json(record) for record in records])
        reply = _invoke(channel, shape, "CreateRecords", "unary_unary")(create, timeout=10)
        assert (reply.count, reply.checksum) == (100, checksum)
        upload = _invoke(channel, shape, "UploadRecords", "stream_unary")
        reply = upload(iter(create.records), timeout=10)  # type: ignore[attr-defined]
        assert (reply.count, reply.checksum) == (100, checksum)

        # cars' Record where the shape's message is due: bytes that do not parse as it.
        wrong = cars_pb2.Record(car=cars_pb2.Car(make="x" * 3, year=7))
        with pytest.raises(grpc.RpcError) as refused:
            raw = channel.unary_unary(
                f"/{kit.service.full_name}/CreateRecords",
                request_serializer=lambda data: data,
                response_deserializer=cars_pb2.CreateRecordsReply.FromString,
            )
            raw(b"\x0a\x03\xff\xfe\xfd" + wrong.SerializeToString(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
