"""Health checks and verification before measuring: status, record count and shape, protocol, TLS."""

import asyncio
import json
import ssl
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.json_format import MessageToDict, ParseError
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from labrunner.backends.base import Backend, Endpoint, ScenarioFailed, ServiceHandle
from labrunner.model.scenario import Scenario, Target
from labrunner.run.drive.clients import opener
from labrunner.run.drive.connection import HTTP3, Reply
from labrunner.run.uploads import UploadBody, first_records
from services.common.contract import RECORD_SHAPE
from services.common.pb import cars_pb2
from services.common.shapes import CARS, Shape, shape_kit

GRPC_SERVICE = CARS.service.full_name  # protolab.cars.v1.RecordService; each shape has its own
TIMEOUT_S = 10.0
_HEALTH_POLL_S = 0.02
_MAX_SHAPE_ERRORS = 3  # enough to see the pattern without burying the message
JSON = "application/json"
_HTTPX_PROTO = {"HTTP/1.1": "HTTP/1.1", "HTTP/2": "HTTP/2.0"}  # k6 spells it HTTP/2.0


@dataclass(frozen=True)
class Verification:
    """What was checked before measuring and what was found."""

    protocol: str | None  # negotiated: HTTP/1.1, HTTP/2.0 or grpc
    tls: bool
    checks: tuple[str, ...]  # checks that passed
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def health(handle: ServiceHandle, target: Target, ca_file: Path) -> str | None:
    """None when the service reports SERVING, else why not (for the timeout message)."""
    try:
        if target.is_grpc:
            with _grpc_channel(handle.address, target.tls, ca_file) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                # types-grpcio-health-checking declares HealthStub without its generated methods.
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)  # type: ignore[attr-defined]
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                return None if status == "SERVING" else f"health status {status}"
        with _http_client(target.tls, ca_file, timeout_s=1.0) as client:
            response = client.get(f"{_base_url(handle.address, target.tls)}/healthz")
            return None if response.status_code == 200 else f"/healthz returned {response.status_code}"
    except (grpc.RpcError, httpx.HTTPError, OSError) as exc:
        return f"not reachable: {_describe(exc)}"


def wait_healthy(
    backend: Backend, handle: ServiceHandle, target: Target, ca_file: Path, timeout_s: float
) -> None:
    """Return once the service reports SERVING; ScenarioFailed with its log when it ends or times out."""
    deadline = time.monotonic() + timeout_s
    reason = "not checked"
    while time.monotonic() < deadline:
        if ended := backend.service_ended(handle):
            raise ScenarioFailed("health", f"{target.main_module} {ended}", backend.service_log_tail(handle))
        reason = health(handle, target, ca_file) or ""
        if not reason:
            return
        time.sleep(_HEALTH_POLL_S)
    message = f"not SERVING after {timeout_s:g}s: {reason}"
    raise ScenarioFailed("health", message, backend.service_log_tail(handle))


def verify(
    handle: ServiceHandle, scenario: Scenario, ca_file: Path, upload: UploadBody | None = None
) -> Verification:
    """Every check a measured run relies on; failures are collected, not raised. An upload scenario's
    server must also answer its body with the count and checksum of the records in it."""
    checker = _rest if not scenario.target.is_grpc else _grpc
    checks: list[str] = []
    failures: list[str] = []
    protocol = checker(handle, scenario, ca_file, checks, failures)
    if upload is not None and protocol is not None:
        uploader = _rest_upload if not scenario.target.is_grpc else _grpc_upload
        uploader(handle, scenario.target, ca_file, upload, checks=checks, failures=failures)
    if handle.metrics_address is not None:
        _check_metrics(handle.metrics_address, checks, failures)
    return Verification(protocol, scenario.target.tls, tuple(checks), tuple(failures))


def canonical_checksum(message: Message) -> int:
    """CRC-32 of a message's canonical serialization (deterministic: map entries in key order): equal
    for two messages exactly when they hold the same records."""
    return zlib.crc32(message.SerializeToString(deterministic=True))


def _expected_records(scenario: Scenario) -> Message:
    """The list message of the scenario's first `count` pool records, what (count, offset=0) returns."""
    kit = shape_kit(scenario.shape)
    expected: Message = kit.list_message()
    add = expected.records.add  # type: ignore[attr-defined]  # every shape's list message has records
    for record in first_records(scenario):
        kit.fill(add(), kit.from_json(record))
    return expected


def _check_same_records(
    got: Message, expected: Message, what: str, checks: list[str], failures: list[str]
) -> None:
    """Whether what a server sent decodes into the pool's records, compared by canonical checksum."""
    mine, theirs = canonical_checksum(got), canonical_checksum(expected)
    _expect(
        mine == theirs,
        f"{what}: the pool's records (canonical checksum {theirs:08x})",
        f"{what}: records differ from the pool's (canonical checksum {mine:08x}, expected {theirs:08x})",
        checks,
        failures,
    )


def record_shape_errors(records: object, count: int) -> list[str]:
    """Why a list of records (canonical JSON field names) is not `count` complete records."""
    if not isinstance(records, list):
        return [f"records is {type(records).__name__}, expected a list"]
    errors = [] if len(records) == count else [f"got {len(records)} records, expected {count}"]
    for index, record in enumerate(records):
        errors.extend(f"record {index}: {e}" for e in _record_errors(record))
        if len(errors) >= _MAX_SHAPE_ERRORS:
            break
    return errors[:_MAX_SHAPE_ERRORS]


def _record_errors(record: object) -> list[str]:
    if not isinstance(record, dict):
        return [f"is {type(record).__name__}, expected an object"]
    # The shape from the proto's descriptor: JSON names and their JSON types.
    errors = [f"unexpected key {k!r}" for k in sorted(set(record) - set(RECORD_SHAPE))]
    for part, shape in RECORD_SHAPE.items():
        spec = shape.fields
        value = record.get(part)
        if not isinstance(value, dict):
            errors.append(f"{part} missing or not an object")
            continue
        errors.extend(f"{part}.{k} missing" for k in spec if k not in value)
        errors.extend(f"unexpected key {part}.{k}" for k in sorted(set(value) - set(spec)))
        for key, kind in spec.items():
            field = value.get(key)
            if key in value and (type(field) is not kind or field == ""):
                errors.append(f"{part}.{key} = {field!r}, expected a non-empty {kind.__name__}")
    return errors


def _rest(
    handle: ServiceHandle, scenario: Scenario, ca_file: Path, checks: list[str], failures: list[str]
) -> str | None:
    target = scenario.target
    path = f"/records?count={scenario.count}&offset=0"
    url = f"{_base_url(handle.address, target.tls)}{path}"
    try:
        response = _get(handle.address, path, target, ca_file)
    except (httpx.HTTPError, OSError) as exc:  # OSError: QUIC's ConnectionError and TimeoutError
        failures.append(f"GET {url} failed: {_describe(exc)}")
        return None
    protocol = response.protocol
    _expect(
        protocol == target.expect_proto,
        f"negotiated {protocol}",
        f"negotiated {protocol}, target expects {target.expect_proto}",
        checks,
        failures,
    )
    text = response.body[:200].decode(errors="replace")
    if response.status != 200:
        failures.append(f"GET {url} returned {response.status}: {text}")
        return protocol
    checks.append("status 200")
    try:
        body = json.loads(response.body)
    except ValueError:
        failures.append(f"GET {url} body is not JSON: {text!r}")
        return protocol
    records = body.get("records") if isinstance(body, dict) else None
    if scenario.shape == "cars":  # each missing or mistyped field named, from the proto's descriptor
        _check_records(records, scenario.count, "REST /records", checks, failures)
    kit = shape_kit(scenario.shape)
    try:
        got = json_format.Parse(response.body, kit.list_message())
    except ParseError as exc:
        failures.append(f"GET {url} body is not {kit.list_message.DESCRIPTOR.full_name}: {exc}")
        return protocol
    _check_same_records(got, _expected_records(scenario), "REST /records", checks, failures)
    return protocol


def _grpc(
    handle: ServiceHandle, scenario: Scenario, ca_file: Path, checks: list[str], failures: list[str]
) -> str | None:
    request = cars_pb2.ListRecordsRequest(count=scenario.count, offset=0)
    kit = shape_kit(scenario.shape)
    expected: Any = _expected_records(scenario)
    try:
        with _grpc_channel(handle.address, scenario.target.tls, ca_file) as channel:
            health_stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", kit.service.full_name):
                # types-grpcio-health-checking declares HealthStub without its generated methods.
                reply = health_stub.Check(  # type: ignore[attr-defined]
                    health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
                )
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                _expect(
                    status == "SERVING",
                    f"health {service or '(server)'} SERVING",
                    f"health {service or '(server)'} is {status}",
                    checks,
                    failures,
                )
            unary = _method(channel, kit, "ListRecords", kit.list_message)(request, timeout=TIMEOUT_S)
            streamed = list(
                _method(channel, kit, "StreamRecords", kit.record_message)(request, timeout=TIMEOUT_S)
            )
            if scenario.shape == "cars":  # each missing or mistyped field named
                _check_records(_as_dicts(unary.records), scenario.count, "ListRecords", checks, failures)
                _check_records(_as_dicts(streamed), scenario.count, "StreamRecords", checks, failures)
            _check_same_records(unary, expected, "ListRecords", checks, failures)
            _check_same_records(
                kit.list_message(records=streamed), expected, "StreamRecords", checks, failures
            )
    except grpc.RpcError as exc:
        failures.append(f"gRPC call to {handle.address} failed: {_describe(exc)}")
        return None
    return "grpc"


def _rest_upload(
    handle: ServiceHandle,
    target: Target,
    ca_file: Path,
    upload: UploadBody,
    *,
    checks: list[str],
    failures: list[str],
) -> None:
    url = f"{_base_url(handle.address, target.tls)}/records"
    try:
        with _http_client(target.tls, ca_file, timeout_s=TIMEOUT_S) as client:
            response = client.post(url, content=upload.path.read_bytes(), headers={"content-type": JSON})
    except httpx.HTTPError as exc:
        failures.append(f"POST {url} failed: {_describe(exc)}")
        return
    try:
        reply = response.json() if response.status_code == 200 else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        failures.append(f"POST {url} returned {response.status_code}: {response.text[:200]}")
        return
    _check_reply(
        reply.get("count"),
        reply.get("checksum"),
        upload,
        "REST POST /records",
        checks=checks,
        failures=failures,
    )


def _grpc_upload(
    handle: ServiceHandle,
    target: Target,
    ca_file: Path,
    upload: UploadBody,
    *,
    checks: list[str],
    failures: list[str],
) -> None:
    kit = shape_kit(upload.shape)
    request: Any = json_format.Parse(upload.path.read_bytes(), kit.create_message())
    reply = cars_pb2.CreateRecordsReply
    try:
        with _grpc_channel(handle.address, target.tls, ca_file) as channel:
            unary = _method(channel, kit, "CreateRecords", reply)(request, timeout=TIMEOUT_S)
            _check_reply(
                unary.count, unary.checksum, upload, "CreateRecords", checks=checks, failures=failures
            )
            upload_records = _method(channel, kit, "UploadRecords", reply, streaming="stream_unary")
            streamed = upload_records(iter(request.records), timeout=TIMEOUT_S)
            _check_reply(
                streamed.count, streamed.checksum, upload, "UploadRecords", checks=checks, failures=failures
            )
    except grpc.RpcError as exc:
        failures.append(f"gRPC upload to {handle.address} failed: {_describe(exc)}")


def _check_reply(
    count: object, checksum: object, upload: UploadBody, what: str, *, checks: list[str], failures: list[str]
) -> None:
    _expect(
        (count, checksum) == (upload.count, upload.checksum),
        f"{what}: {upload.count} records received, checksum {upload.checksum}",
        f"{what}: the server answered count {count}, checksum {checksum}; "
        f"sent {upload.count} records, checksum {upload.checksum}",
        checks,
        failures,
    )


def _check_metrics(address: Endpoint, checks: list[str], failures: list[str]) -> None:
    url = f"http://{address}/metrics"
    try:
        response = httpx.get(url, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        failures.append(f"GET {url} failed: {_describe(exc)}")
        return
    _expect(
        response.status_code == 200 and "protolab_build_info" in response.text,
        "metrics endpoint serves protolab_build_info",
        f"GET {url} returned {response.status_code} without protolab_build_info",
        checks,
        failures,
    )


def _check_records(records: object, count: int, what: str, checks: list[str], failures: list[str]) -> None:
    errors = record_shape_errors(records, count)
    _expect(not errors, f"{what}: {count} complete records", f"{what}: {'; '.join(errors)}", checks, failures)


def _expect(ok: bool, passed: str, failed: str, checks: list[str], failures: list[str]) -> None:
    (checks if ok else failures).append(passed if ok else failed)


def _as_dicts(records: Any) -> list[dict[str, Any]]:
    # Zero-valued fields (mileage 0) are printed too, so the shape check sees every field.
    return [MessageToDict(r, always_print_fields_with_no_presence=True) for r in records]


def _method(channel: grpc.Channel, kit: Shape, method: str, reply: type[Message], streaming: str = "") -> Any:
    """A callable of one of the shape's service's methods (cars: RecordService), its reply decoded as
    reply; streaming names the channel's factory for the streaming ones."""
    kinds = {"ListRecords": "unary_unary", "StreamRecords": "unary_stream", "CreateRecords": "unary_unary"}
    factory = getattr(channel, streaming or kinds[method])
    return factory(
        f"/{kit.service.full_name}/{method}",
        request_serializer=_serialize,
        response_deserializer=reply.FromString,
    )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _base_url(address: Endpoint, tls: bool) -> str:
    return f"{'https' if tls else 'http'}://{address}"


def _http_client(tls: bool, ca_file: Path, timeout_s: float) -> httpx.Client:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if tls else False
    return httpx.Client(http2=True, verify=verify, timeout=timeout_s)


def _get(address: Endpoint, path: str, target: Target, ca_file: Path) -> Reply:
    """GET path as k6 or the Python driver would: over HTTP/3 for an h3 target (the driver's own client,
    which fails unless QUIC negotiated h3), else offering h2 like k6 does, so that the server's ALPN
    choice is what gets verified."""
    if target.protocol == "http3":
        return asyncio.run(_get_h3(_base_url(address, tls=True), path, ca_file))
    with _http_client(target.tls, ca_file, timeout_s=TIMEOUT_S) as client:
        response = client.get(f"{_base_url(address, target.tls)}{path}")
    protocol = _HTTPX_PROTO.get(response.http_version, response.http_version)
    return Reply(response.status_code, response.content, 0, protocol)


async def _get_h3(base_url: str, path: str, ca_file: Path) -> Reply:
    connection = await opener(HTTP3, base_url, ca_file)()
    try:
        return await asyncio.wait_for(connection.get(path), TIMEOUT_S)
    finally:
        await connection.close()


def _grpc_channel(address: Endpoint, tls: bool, ca_file: Path) -> grpc.Channel:
    if not tls:
        return grpc.insecure_channel(str(address))
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
    return grpc.secure_channel(str(address), credentials)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
