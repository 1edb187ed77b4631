"""Bytes per response body for JSON and protobuf, raw and gzip, from the services' record pool."""

import gzip
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message

from services.common.config import load_settings
from services.common.pool import DEFAULT_SHAPE
from services.common.records import JsonRecord, load_pool
from services.common.shapes import SHAPE_KITS

SCHEMA = "protolab.payload/1"
COUNTS = (1, 10, 100, 1000)
# zlib's default, and what aiohttp and gRPC's gzip use unless configured otherwise.
GZIP_LEVEL = 6
# Every service reads the pool from the same RECORD_POOL_SIZE and RECORD_SEED; the service named
# here only picks the default ports, which the payload does not use.
POOL_SERVICE = "rest_aiohttp"


@dataclass(frozen=True)
class PayloadRow:
    """The bodies of one response of `count` records, as each server sends them."""

    count: int
    json_bytes: int
    json_gzip_bytes: int
    protobuf_bytes: int
    protobuf_gzip_bytes: int


def pool_records(count: int, shape: str = DEFAULT_SHAPE) -> list[JsonRecord]:
    """The records a server of `shape` returns for (count, offset=0): the first ones of its pool."""
    settings = load_settings(POOL_SERVICE)
    pool = load_pool(settings.record_pool_size, settings.record_seed, shape)
    return [pool[i % len(pool)] for i in range(count)]


def json_body(records: Sequence[JsonRecord]) -> bytes:
    """The REST body, encoded as services.common.rest.records_body encodes it."""
    return orjson.dumps({"records": list(records)})


def protobuf_message(records: Sequence[JsonRecord], shape: str = DEFAULT_SHAPE) -> Message:
    """The gRPC response of `shape` for the same records, parsed from the JSON body: equal content by
    construction."""
    return json_format.Parse(json_body(records), SHAPE_KITS[shape].list_message())


def measurable(shape: str) -> bool:
    """Whether the body sizes and the serialization benchmark know the shape: the built-in ones (a
    user's --proto message is compiled only for its run)."""
    return shape in SHAPE_KITS


def measure(counts: Sequence[int] = COUNTS, shape: str = DEFAULT_SHAPE) -> list[PayloadRow]:
    """One row per count, from the same records of `shape` for both encodings; none for a shape not
    measurable()."""
    if not measurable(shape):
        return []
    records = pool_records(max(counts), shape)
    rows = []
    for count in counts:
        body = json_body(records[:count])
        message = protobuf_message(records[:count], shape).SerializeToString()
        rows.append(
            PayloadRow(
                count=count,
                json_bytes=len(body),
                json_gzip_bytes=len(gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)),
                protobuf_bytes=len(message),
                protobuf_gzip_bytes=len(gzip.compress(message, compresslevel=GZIP_LEVEL, mtime=0)),
            )
        )
    return rows


def as_document(rows: Sequence[PayloadRow]) -> dict[str, Any]:
    """payload.json in a run directory."""
    settings = load_settings(POOL_SERVICE)
    return {
        "schema": SCHEMA,
        "pool": {"size": settings.record_pool_size, "seed": settings.record_seed},
        "gzip_level": GZIP_LEVEL,
        "rows": [asdict(row) for row in rows],
    }


def rows_from_document(document: Any) -> list[PayloadRow]:
    """The rows of a payload.json; empty when it is not one."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return []
    return [PayloadRow(**row) for row in document["rows"]]
