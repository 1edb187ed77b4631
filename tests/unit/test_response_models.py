"""RESPONSE_MODEL on every server, in process: build maps `count` records per request and reuses
nothing; prebuilt maps each pool record once at start and shares those objects between requests."""

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from quart import Quart
from quart.wrappers.response import DataBody

from services.common import shapes
from services.common.config import ResponseModel, Settings, load_settings
from services.common.environment import ConfigError
from services.common.pb import cars_pb2
from services.common.rest import Health, RecordBodies
from services.common.stacks import STACKS
from services.common.supervisor import record_source
from services.grpc_aio import server as grpc_server
from services.grpc_grpclib import servicer as grpclib_servicer
from services.rest_aiohttp.server import build_app
from services.rest_quart.app import build_app as build_quart_app
from services.rest_quart.app import create_app

POOL_SIZE = 50
MAX_COUNT = 20
COUNT, OFFSET = 10, POOL_SIZE - 3  # a window that wraps around the pool
SERVERS = tuple(stack.package for stack in STACKS)  # every declared stack; how each is asked: REQUESTS


class AbortContext:
    """The one ServicerContext method RecordServicer calls; a valid request never reaches it."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, service: str, model: ResponseModel) -> Settings:
    for name, value in {
        "RECORD_POOL_SIZE": str(POOL_SIZE),
        "RECORD_SEED": "42",
        "MAX_COUNT": str(MAX_COUNT),
        "DEFAULT_COUNT": str(COUNT),
        "METRICS_ENABLED": "0",
        "RESPONSE_MODEL": model.value,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),  # the Quart app's drain flag lives there
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings(service)


def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Replace the cars shape's mapping `name` (services.common.shapes.Shape: to_json maps a list of
    records, fill one), which every server takes from shape_kit at start, by one that counts the
    records it maps: [records]."""
    calls = [0]
    original = getattr(shapes.CARS, name)

    def counting(records: Any, *args: Any) -> Any:
        calls[0] += len(records) if isinstance(records, list) else 1
        return original(records, *args)

    monkeypatch.setitem(shapes.SHAPE_KITS, "cars", dataclasses.replace(shapes.CARS, **{name: counting}))
    return calls


def aiohttp_request(config: Settings) -> Callable[[], Awaitable[bytes]]:
    app = build_app(record_source(config), Health(), config, metrics=None)

    async def request() -> bytes:
        mocked = make_mocked_request("GET", f"/records?count={COUNT}&offset={OFFSET}", app=app)
        response = await (await app.router.resolve(mocked)).handler(mocked)
        assert response.status == 200 and isinstance(response.body, bytes)
        return response.body

    return request


def quart_request(_config: Settings) -> Callable[[], Awaitable[bytes]]:
    return _quart_app_request(create_app())  # Hypercorn's worker app, from the env of _config


def granian_request(config: Settings) -> Callable[[], Awaitable[bytes]]:
    # Granian's worker builds the same Quart app from its settings.
    return _quart_app_request(build_quart_app(config, record_source(config), Health()))


def _quart_app_request(app: Quart) -> Callable[[], Awaitable[bytes]]:
    async def request() -> bytes:
        query = {"count": str(COUNT), "offset": str(OFFSET)}
        async with app.test_request_context("/records", query_string=query):
            response = await app.view_functions["list_records"]()
        assert response.status_code == 200 and isinstance(response.response, DataBody)
        return response.response.data  # the bytes the handler made, as the server will send them

    return request


def grpc_request(config: Settings) -> Callable[[], Awaitable[bytes]]:
    servicer = grpc_server.record_servicer(  # as the worker makes it (services/grpc_aio/server.py)
        record_source(config),
        config.response_model,
        config.max_request_bytes,
        None,
        shapes.shape_kit(config.shape),
    )
    responses: list[cars_pb2.ListRecordsResponse] = []

    async def request() -> bytes:
        call = cars_pb2.ListRecordsRequest(count=COUNT, offset=OFFSET)
        response = await servicer.ListRecords(call, AbortContext())
        assert all(response is not earlier for earlier in responses), "a response object was handed out twice"
        responses.append(response)
        return response.SerializeToString()  # what grpc does with it, as the registered serializer

    return request


class OneRequestStream:
    """A grpclib call's stream as RecordService uses it: one request in, the messages sent kept."""

    def __init__(self, request: cars_pb2.ListRecordsRequest) -> None:
        self.request = request
        self.sent: list[Any] = []

    async def recv_message(self) -> cars_pb2.ListRecordsRequest:
        return self.request

    async def send_message(self, message: Any) -> None:
        self.sent.append(message)


def grpclib_request(config: Settings) -> Callable[[], Awaitable[bytes]]:
    service = grpclib_servicer.RecordService(
        record_source(config),
        config.response_model,
        config.max_request_bytes,
        grpclib_servicer.Calls(None),
        shapes.shape_kit(config.shape),  # as the worker takes it (services/grpc_grpclib/server.py)
    )
    responses: list[cars_pb2.ListRecordsResponse] = []

    async def request() -> bytes:
        stream = OneRequestStream(cars_pb2.ListRecordsRequest(count=COUNT, offset=OFFSET))
        await service.ListRecords(stream)
        (response,) = stream.sent
        assert all(response is not earlier for earlier in responses), "a response object was handed out twice"
        responses.append(response)
        return response.SerializeToString()  # what grpclib's codec does with it

    return request


REQUESTS = {
    "rest_aiohttp": aiohttp_request,
    "rest_quart": quart_request,
    "rest_granian": granian_request,
    "grpc_aio": grpc_request,
    "grpc_grpclib": grpclib_request,
}
# The shape's function each server maps neutral records with: REST a list into dicts (to_json), gRPC
# one into a message (fill).
MAPPINGS = {
    "rest_aiohttp": "to_json",
    "rest_quart": "to_json",
    "rest_granian": "to_json",
    "grpc_aio": "fill",
    "grpc_grpclib": "fill",
}


def test_every_declared_stack_is_asked_in_process() -> None:
    missing = sorted(set(SERVERS) - set(REQUESTS) | set(SERVERS) - set(MAPPINGS))
    assert not missing, f"no in-process request or mapping here (REQUESTS, MAPPINGS) for {missing}"


@pytest.mark.parametrize("model", list(ResponseModel))
@pytest.mark.parametrize("service", SERVERS)
def test_each_request_maps_its_records_only_under_build(monkeypatch, tmp_path, service, model) -> None:
    config = settings(monkeypatch, tmp_path, service, model)
    calls = counted(monkeypatch, MAPPINGS[service])
    request = REQUESTS[service](config)
    at_start = calls[0]

    async def two_requests() -> tuple[bytes, bytes]:
        return await request(), await request()

    first, second = asyncio.run(two_requests())
    assert first == second
    assert first is not second, "the same bytes were handed out twice"
    if model is ResponseModel.BUILD:
        assert (at_start, calls[0]) == (0, 2 * COUNT)  # nothing made at start, count records per request
    else:
        assert (at_start, calls[0]) == (POOL_SIZE, POOL_SIZE)  # each pool record once, none per request


@pytest.mark.parametrize("model", list(ResponseModel))
def test_rest_records_are_new_dicts_under_build_and_shared_under_prebuilt(
    monkeypatch, tmp_path, model
) -> None:
    bodies = RecordBodies(record_source(settings(monkeypatch, tmp_path, "rest_aiohttp", model)), model)
    first, second = (bodies.document(COUNT, OFFSET)["records"] for _ in range(2))
    assert first == second and len(first) == COUNT
    pairs = [
        (one, other)
        for record, again in zip(first, second, strict=True)
        for one, other in (
            (record, again),
            (record["car"], again["car"]),
            (record["driver"], again["driver"]),
        )
    ]
    if model is ResponseModel.BUILD:
        assert all(one is not other for one, other in pairs)
    else:
        assert all(one is other for one, other in pairs)


@pytest.mark.parametrize("model", list(ResponseModel))
def test_grpc_messages_are_new_under_build_and_shared_under_prebuilt(monkeypatch, tmp_path, model) -> None:
    config = settings(monkeypatch, tmp_path, "grpc_aio", model)
    servicer = grpc_server.RecordServicer(record_source(config), model, config.max_request_bytes)
    call = cars_pb2.ListRecordsRequest(count=COUNT, offset=OFFSET)

    async def streamed() -> list[cars_pb2.Record]:
        return [message async for message in servicer.StreamRecords(call, AbortContext())]

    first, second = asyncio.run(streamed()), asyncio.run(streamed())
    assert first == second and len(first) == COUNT
    if model is ResponseModel.BUILD:
        assert all(one is not other for one, other in zip(first, second, strict=True))
    else:
        assert all(one is other for one, other in zip(first, second, strict=True))


def test_a_bad_response_model_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("RESPONSE_MODEL", "cached")
    with pytest.raises(ConfigError, match="RESPONSE_MODEL='cached'"):
        load_settings("grpc_aio")
    monkeypatch.delenv("RESPONSE_MODEL")
    assert load_settings("grpc_aio").response_model is ResponseModel.BUILD  # the default


def test_prebuilt_needs_the_pool(monkeypatch) -> None:
    monkeypatch.setenv("RESPONSE_MODEL", "prebuilt")
    monkeypatch.setenv("RECORD_MODE", "live")
    with pytest.raises(ConfigError, match="RESPONSE_MODEL=prebuilt needs RECORD_MODE=pool"):
        load_settings("rest_quart")
