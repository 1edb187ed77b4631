"""What every REST server shares: the OpenAPI document, JSON bodies and errors, query parsing, the upload
(POST /records), health."""

import functools
import gzip
from collections.abc import Callable, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson

from services.common.config import GZIP, ResponseModel
from services.common.contract import RECORD_SHAPE
from services.common.records import (
    BadRequest,
    Car,
    Driver,
    JsonRecord,
    Prebuilt,
    Record,
    RecordSource,
    parse_query_int,
)
from services.common.shapes import CARS, Shape

JSON = "application/json"
ROUTES = ("/records", "/healthz", "/openapi.json")
# The http_route label of requests no route matched: one value, however many paths clients try.
UNMATCHED_ROUTE = "unmatched"
# Equal on both REST servers so they queue the same connection storm and keep idle
# connections equally long (longer than any pause in a scenario).
LISTEN_BACKLOG = 1024
KEEP_ALIVE_TIMEOUT_SECONDS = 75.0

# The proto's int32 (a record's year and mileage): what an upload may send.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_INT32 = {**_INTEGER, "format": "int32", "minimum": INT32_MIN, "maximum": INT32_MAX}
_SCHEMA_TYPES = {str: _STRING, int: _INT32}  # a JSON value's Python type -> its schema


def _ref(schema: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{schema}"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _json_response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _record_schemas() -> dict[str, dict[str, Any]]:
    """The Record schema and one per message in it (Car, Driver), from the proto's descriptor."""
    schemas = {
        shape.name: _object({name: _SCHEMA_TYPES[kind] for name, kind in shape.fields.items()})
        for shape in RECORD_SHAPE.values()
    }
    schemas["Record"] = _object({key: _ref(shape.name) for key, shape in RECORD_SHAPE.items()})
    return schemas


def openapi_document(max_count: int, default_count: int, max_request_bytes: int) -> dict[str, Any]:
    """The OpenAPI 3 description of the REST API, with this server's count and body bounds."""
    error_ref = _ref("Error")
    health_ref = _ref("Health")
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "protolab records",
            "version": "1.0.0",
            "description": "Car and driver records from a fixed pool; the same data contract as the "
            "gRPC service protolab.cars.v1.RecordService, with protobuf canonical JSON field names.",
        },
        "paths": {
            "/records": {
                "get": {
                    "operationId": "listRecords",
                    "summary": "count records starting at pool position offset",
                    "parameters": [
                        {
                            "name": "count",
                            "in": "query",
                            "required": False,
                            "description": "Number of records.",
                            "schema": {
                                **_INTEGER,
                                "minimum": 1,
                                "maximum": max_count,
                                "default": default_count,
                            },
                        },
                        {
                            "name": "offset",
                            "in": "query",
                            "required": False,
                            "description": "Pool position of the first record (wraps around the pool); "
                            "without it the server rotates through the pool.",
                            "schema": {**_INTEGER, "minimum": 0},
                        },
                    ],
                    "responses": {
                        "200": _json_response("The records.", _ref("RecordList")),
                        "400": _json_response("count or offset not an integer, or out of range.", error_ref),
                    },
                },
                "post": {
                    "operationId": "createRecords",
                    "summary": "Upload records: the server decodes them and answers how many it received "
                    "and their checksum",
                    "requestBody": {
                        "required": True,
                        "content": {JSON: {"schema": _ref("RecordUpload")}},
                    },
                    "responses": {
                        "200": _json_response("What the server decoded.", _ref("UploadReply")),
                        "400": _json_response(
                            "Not JSON, or not the schema: the error names the place, e.g. "
                            "records[3].car.year.",
                            error_ref,
                        ),
                        "413": _json_response(f"A body over {max_request_bytes} bytes.", error_ref),
                        "415": _json_response(
                            f"A Content-Type other than {JSON}, or a Content-Encoding other than identity.",
                            error_ref,
                        ),
                    },
                },
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "Whether the server takes requests",
                    "responses": {
                        "200": _json_response("Serving.", health_ref),
                        "503": _json_response("Shutting down: still answering, stop sending.", health_ref),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {"200": _json_response("The OpenAPI document.", {"type": "object"})},
                }
            },
        },
        "components": {
            "schemas": {
                **_record_schemas(),
                "RecordList": _object({"records": {"type": "array", "items": _ref("Record")}}),
                "RecordUpload": _object(
                    {
                        "records": {
                            "type": "array",
                            "items": _ref("Record"),
                            "minItems": 1,
                            "maxItems": max_count,
                        }
                    }
                ),
                "UploadReply": _object(
                    {
                        "count": {**_INTEGER, "minimum": 1, "maximum": max_count},
                        # CreateRecordsReply.checksum, a uint32 (services.common.records.checksum)
                        "checksum": {**_INTEGER, "minimum": 0, "maximum": 2**32 - 1},
                    }
                ),
                "Health": _object({"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING"]}}),
                "Error": _object({"error": _STRING, "status": {**_INTEGER, "minimum": 400, "maximum": 599}}),
            }
        },
    }


def error_body(status: int, message: str | None = None) -> bytes:
    """The JSON error body; the message defaults to the status phrase ("Not Found")."""
    return orjson.dumps({"error": message or HTTPStatus(status).phrase, "status": status})


class RecordBodies:
    """The /records bodies of every REST server, of the shape (cars by default), under the response
    model (ResponseModel).

    build: each request maps its neutral records into new dicts (the shape's to_json, cars'
    json_records), then encodes them. prebuilt: the dicts are made once at start; a request slices
    and encodes them. Encoded per request either way, as the gRPC server serializes per request.
    """

    def __init__(self, source: RecordSource, model: ResponseModel, shape: Shape = CARS) -> None:
        self._source = source
        self._to_json = shape.to_json
        self._prebuilt = Prebuilt(source, shape.to_json) if model is ResponseModel.PREBUILT else None

    def document(self, count: int, offset: int | None) -> dict[str, list[JsonRecord]]:
        """The body's objects for valid (count, offset)."""
        if self._prebuilt is not None:
            return {"records": self._prebuilt.objects(count, offset)}
        return {"records": self._to_json(self._source.records(count, offset))}

    def body(self, count: str | None, offset: str | None) -> bytes:
        """The body for the raw query values; BadRequest for a bad value."""
        valid = self._source.validate(parse_query_int("count", count), parse_query_int("offset", offset))
        return orjson.dumps(self.document(*valid))


# zlib's default level, the one aiohttp's and most servers' gzip use.
GZIP_LEVEL = 6


class ResponseEncoding:
    """The /records body as the client accepts it, under the server's COMPRESSION: gzip when the
    server compresses and Accept-Encoding lists gzip (not at q=0), else as it is.

    Every REST server compresses here, in the request's own thread at one level, so the servers pay
    the same for it: aiohttp's own compression hands bodies over 1 KiB to a thread pool, and Quart
    (on Hypercorn or Granian) has none.
    """

    def __init__(self, compression: str) -> None:
        self._gzip = compression == GZIP

    def encode(self, body: bytes, accept_encoding: str | None) -> tuple[bytes, dict[str, str] | None]:
        """(body, headers to add): Vary from a server that compresses, Content-Encoding when it did;
        none from one that does not, whose responses stay exactly what they were before compression."""
        if not self._gzip:
            return body, None
        if not accepts_gzip(accept_encoding):
            return body, {"Vary": "Accept-Encoding"}
        return gzip.compress(body, GZIP_LEVEL, mtime=0), {"Vary": "Accept-Encoding", "Content-Encoding": GZIP}


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header accepts gzip (RFC 9110 12.5.3): gzip (or its alias x-gzip)
    listed at a quality above 0, else a * above 0 (which stands for the codings not listed)."""
    qualities: dict[str, float] = {}
    for item in (accept_encoding or "").split(","):
        coding, _, parameters = item.partition(";")
        name = coding.strip().lower()
        qualities[GZIP if name == "x-gzip" else name] = _quality(parameters)
    return qualities.get(GZIP, qualities.get("*", 0.0)) > 0


def _quality(parameters: str) -> float:
    """An Accept-Encoding item's q (1 when absent); 0, never chosen, when it is not a number."""
    value = parameters.strip().lower()
    if not value:
        return 1.0
    try:
        return float(value.removeprefix("q=").strip())
    except ValueError:
        return 0.0


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header is application/json, its parameters (charset) aside."""
    return content_type is not None and content_type.partition(";")[0].strip().lower() == JSON


_WRONG_CONTENT_TYPE = error_body(415, f"Content-Type must be {JSON}")
_ENCODED = error_body(415, "Content-Encoding is not accepted: send the body uncompressed")


class Uploads:
    """POST /records on every REST server: the answer to an upload's body, once the server has read
    it. Each framework holds the body to max_request_bytes itself and answers too_large (413) past it.

    The checks, in order: 415 unless the Content-Type is application/json, then 400 for a body that
    is not JSON or not the schema, with the place named ("records[3].car.year: expected an
    integer"), else 200 {"count": N, "checksum": C} over the records as decoded into the neutral
    form (services.common.records.checksum).
    """

    def __init__(self, max_count: int, max_request_bytes: int, shape: Shape = CARS) -> None:
        self._max_count = max_count
        self._checksum = shape.checksum
        decode = shape.from_upload
        self._records: Callable[[bytes, int], list[Any]] = (
            records_from_body if decode is None else functools.partial(shape_records_from_body, decode)
        )
        self.too_large = error_body(413, f"request body larger than {max_request_bytes} bytes")

    def refused_encoding(self, content_encoding: str | None) -> tuple[int, bytes] | None:
        """415 for a body under any Content-Encoding but identity, before it is read: every REST server
        refuses them alike, so that none inflates a compressed body (a bomb) and none reads gzip as
        JSON (issue 37)."""
        if content_encoding is None or content_encoding.strip().lower() in {"", "identity"}:
            return None
        return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, _ENCODED

    def answer(self, content_type: str | None, body: bytes) -> tuple[int, bytes]:
        """The status and body of the reply to an upload of body."""
        if not is_json(content_type):
            return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, _WRONG_CONTENT_TYPE
        try:
            records = self._records(body, self._max_count)
        except BadRequest as error:
            return HTTPStatus.BAD_REQUEST, error_body(400, str(error))
        return HTTPStatus.OK, orjson.dumps({"count": len(records), "checksum": self._checksum(records)})


def _record_items(body: bytes, max_count: int) -> list[Any]:
    """An upload body's records array: BadRequest unless an object of exactly "records", an array of
    1..max_count items."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None
    if type(document) is not dict:
        raise BadRequest("body: expected an object")
    for key in document:
        if key != "records":
            raise BadRequest(f"{key}: unknown field")
    if "records" not in document:
        raise BadRequest("records: missing")
    items = document["records"]
    if type(items) is not list:
        raise BadRequest("records: expected an array")
    if not 1 <= len(items) <= max_count:
        raise BadRequest(f"records: expected 1 to {max_count} records, got {len(items)}")
    return items


def shape_records_from_body(from_upload: Callable[[Any, str], Any], body: bytes, max_count: int) -> list[Any]:
    """An upload's records of a shape beside cars as its neutral records; BadRequest naming the first
    place that is wrong (services.common.shapes' decoders, field by field)."""
    items = _record_items(body, max_count)
    return [from_upload(item, f"records[{index}]") for index, item in enumerate(items)]


def records_from_body(body: bytes, max_count: int) -> list[Record]:
    """An upload's records as neutral records; BadRequest naming the first place that is wrong.

    Exactly the GET body's shape: unknown fields are refused as missing ones are, strings must be
    strings and numbers int32 (a bool is no integer). Each record takes one pass of lookups and
    exact type checks; only a record that fails them is walked again, by _record_problem, to say why.
    """
    records = []
    for index, item in enumerate(_record_items(body, max_count)):
        try:  # a lookup in anything but an object (a list, a string, a number) is a TypeError
            car, driver = item["car"], item["driver"]
            make, model, trim, color = car["make"], car["model"], car["trim"], car["color"]
            year, mileage = car["year"], car["mileage"]
            firstname, lastname, driver_id = driver["firstname"], driver["lastname"], driver["driverId"]
        except (KeyError, TypeError):
            raise BadRequest(_record_problem(item, f"records[{index}]")) from None
        if not (
            len(item) == 2
            and len(car) == 6
            and len(driver) == 3
            and type(make) is str
            and type(model) is str
            and type(trim) is str
            and type(color) is str
            and type(year) is int
            and INT32_MIN <= year <= INT32_MAX
            and type(mileage) is int
            and INT32_MIN <= mileage <= INT32_MAX
            and type(firstname) is str
            and type(lastname) is str
            and type(driver_id) is str
        ):
            raise BadRequest(_record_problem(item, f"records[{index}]"))
        records.append(
            Record(Car(make, model, trim, color, year, mileage), Driver(firstname, lastname, driver_id))
        )
    return records


def _record_problem(item: Any, place: str) -> str:
    """What is wrong with a record that failed records_from_body's checks: '<place>: <what>', the
    first unknown or missing field or wrong value in the contract's order (RECORD_SHAPE)."""
    problem = _fields_problem(item, place, RECORD_SHAPE)
    if problem is not None:
        return problem
    for key, shape in RECORD_SHAPE.items():
        part, part_place = item[key], f"{place}.{key}"
        problem = _fields_problem(part, part_place, shape.fields)
        if problem is not None:
            return problem
        for name, kind in shape.fields.items():
            value = part[name]
            if kind is str and type(value) is not str:
                return f"{part_place}.{name}: expected a string"
            if kind is int and type(value) is not int:
                return f"{part_place}.{name}: expected an integer"
            if kind is int and not INT32_MIN <= value <= INT32_MAX:
                return f"{part_place}.{name}: expected a 32-bit integer"
    raise AssertionError(f"{place}: refused by records_from_body, yet no problem found")


def _fields_problem(value: Any, place: str, names: Mapping[str, Any]) -> str | None:
    """Why value is not an object of exactly these fields (the first unknown, then the first
    missing one), or None."""
    if type(value) is not dict:
        return f"{place}: expected an object"
    for key in value:
        if key not in names:
            return f"{place}.{key}: unknown field"
    for name in names:
        if name not in value:
            return f"{place}.{name}: missing"
    return None


def route_label(template: str | None, path: str) -> str:
    """The http_route label: the matched route template, the path of a route the method did not
    match (405), or UNMATCHED_ROUTE, so clients cannot grow the label set."""
    if template is not None:
        return template
    return path if path in ROUTES else UNMATCHED_ROUTE


class Health:
    """SERVING until shutdown starts, then NOT_SERVING while the server drains.

    Draining starts in this process (start_draining), or in another process that
    creates flag_file: Hypercorn's supervising process tells its workers that way.
    """

    _SERVING = orjson.dumps({"status": "SERVING"})
    _NOT_SERVING = orjson.dumps({"status": "NOT_SERVING"})

    def __init__(self, flag_file: Path | None = None) -> None:
        self._flag_file = flag_file
        self._draining = False

    def start_draining(self) -> None:
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining or (self._flag_file is not None and self._flag_file.exists())

    def response(self) -> tuple[int, bytes]:
        """The status code and body of GET /healthz."""
        if self.draining:
            return HTTPStatus.SERVICE_UNAVAILABLE, self._NOT_SERVING
        return HTTPStatus.OK, self._SERVING
