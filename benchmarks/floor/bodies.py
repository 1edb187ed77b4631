"""The floors' /records bodies: the lab's JSON bytes from flat tuples, orjson-encoded per request."""

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from benchmarks.floor.common import FlatRecord, FloorSettings, Records, query_int

# A body from the raw count and offset query values; BadRequest for a bad one.
BodyOf = Callable[[str | None, str | None], bytes]


def documents(records: Sequence[FlatRecord]) -> list[dict[str, Any]]:
    """The records as the body's dicts, with the proto's canonical JSON names (driverId)."""
    return [
        {
            "car": {
                "make": make,
                "model": model,
                "trim": trim,
                "color": color,
                "year": year,
                "mileage": mileage,
            },
            "driver": {"firstname": firstname, "lastname": lastname, "driverId": driver_id},
        }
        for make, model, trim, color, year, mileage, firstname, lastname, driver_id in records
    ]


def body_maker(
    settings: FloorSettings, records: Records, documents: Callable[[Any], list[dict[str, Any]]] = documents
) -> BodyOf:
    """build: each request maps its tuples into new dicts (documents: the shape's, cars' by default);
    prebuilt: the dicts are made once and a request slices them. Encoded per request either way, as in
    the lab."""
    window = records.window
    start_of = records.start
    if settings.prebuilt:
        prebuilt = documents(records.pool)
        prebuilt += prebuilt[: len(window) - len(prebuilt)]

        def sliced(count: str | None, offset: str | None) -> bytes:
            start, n = start_of(query_int("count", count), query_int("offset", offset))
            return orjson.dumps({"records": prebuilt[start : start + n]})

        return sliced

    def built(count: str | None, offset: str | None) -> bytes:
        start, n = start_of(query_int("count", count), query_int("offset", offset))
        return orjson.dumps({"records": documents(window[start : start + n])})

    return built
