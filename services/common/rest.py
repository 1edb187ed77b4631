"""What both REST servers share: the OpenAPI document, JSON bodies and errors, query parsing, health."""

from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson

from services.common.config import ResponseModel
from services.common.contract import RECORD_SHAPE
from services.common.records import JsonRecord, Prebuilt, RecordSource, json_records, parse_query_int

JSON = "application/json"
ROUTES = ("/records", "/healthz", "/openapi.json")
# The http_route label of requests no route matched: one value, however many paths clients try.
UNMATCHED_ROUTE = "unmatched"
# Equal on both REST servers so they queue the same connection storm and keep idle
# connections equally long (longer than any pause in a scenario).
LISTEN_BACKLOG = 1024
KEEP_ALIVE_TIMEOUT_SECONDS = 75.0

_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_SCHEMA_TYPES = {str: _STRING, int: _INTEGER}  # a JSON value's Python type -> its schema


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


def openapi_document(max_count: int, default_count: int) -> dict[str, Any]:
    """The OpenAPI 3 description of the REST API, with this server's count bounds."""
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
                }
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
                "Health": _object({"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING"]}}),
                "Error": _object({"error": _STRING, "status": {**_INTEGER, "minimum": 400, "maximum": 599}}),
            }
        },
    }


def error_body(status: int, message: str | None = None) -> bytes:
    """The JSON error body; the message defaults to the status phrase ("Not Found")."""
    return orjson.dumps({"error": message or HTTPStatus(status).phrase, "status": status})


class RecordBodies:
    """The /records bodies of both REST servers, under the response model (ResponseModel).

    build: each request maps its neutral records into new dicts (json_records), then encodes
    them. prebuilt: the dicts are made once at start; a request slices and encodes them.
    Encoded per request either way, as the gRPC server serializes per request.
    """

    def __init__(self, source: RecordSource, model: ResponseModel) -> None:
        self._source = source
        self._prebuilt = Prebuilt(source, json_records) if model is ResponseModel.PREBUILT else None

    def document(self, count: int, offset: int | None) -> dict[str, list[JsonRecord]]:
        """The body's objects for valid (count, offset)."""
        if self._prebuilt is not None:
            return {"records": self._prebuilt.objects(count, offset)}
        return {"records": json_records(self._source.records(count, offset))}

    def body(self, count: str | None, offset: str | None) -> bytes:
        """The body for the raw query values; BadRequest for a bad value."""
        valid = self._source.validate(parse_query_int("count", count), parse_query_int("offset", offset))
        return orjson.dumps(self.document(*valid))


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
