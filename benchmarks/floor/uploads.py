"""The floors' POST /records: an upload decoded into flat tuples and answered with its count and
checksum, with the lab's statuses and messages (services/common/rest.py Uploads, word for word)."""

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from benchmarks.floor.common import BadRequest, FlatRecord, checksum, error_body

JSON = "application/json"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# A record's JSON fields (the proto's canonical names, in its order) and the type of each value.
SHAPE: dict[str, dict[str, type]] = {
    "car": {"make": str, "model": str, "trim": str, "color": str, "year": int, "mileage": int},
    "driver": {"firstname": str, "lastname": str, "driverId": str},
}
_WRONG_CONTENT_TYPE = error_body(f"Content-Type must be {JSON}", 415)
_ENCODED = error_body("Content-Encoding is not accepted: send the body uncompressed", 415)


class Uploads:
    """The answer to an upload's body once the server has read it; the framework holds the body to
    max_request_bytes and the server answers too_large (413) past it."""

    def __init__(
        self,
        max_count: int,
        max_request_bytes: int,
        records_of_body: Callable[[bytes, int], list[Any]] | None = None,
        checksum_of: Callable[[Sequence[Any]], int] | None = None,
    ) -> None:
        """records_of_body and checksum_of: the shape's (benchmarks/floor/shapes.py), cars' by default."""
        self._max_count = max_count
        self._records = flat_records if records_of_body is None else records_of_body
        self._checksum = checksum if checksum_of is None else checksum_of
        self.too_large = error_body(f"request body larger than {max_request_bytes} bytes", 413)

    def refused_encoding(self, content_encoding: str | None) -> tuple[int, bytes] | None:
        """415 for a body under any Content-Encoding but identity, before it is read, as the lab."""
        if content_encoding is None or content_encoding.strip().lower() in {"", "identity"}:
            return None
        return 415, _ENCODED

    def answer(self, content_type: str | None, body: bytes) -> tuple[int, bytes]:
        """The status and body of the reply: 415 unless application/json, 400 for a bad body, else
        200 {"count": N, "checksum": C}."""
        if content_type is None or content_type.partition(";")[0].strip().lower() != JSON:
            return 415, _WRONG_CONTENT_TYPE
        try:
            records = self._records(body, self._max_count)
        except BadRequest as error:
            return 400, error_body(str(error))
        return 200, orjson.dumps({"count": len(records), "checksum": self._checksum(records)})


def record_items(body: bytes, max_count: int) -> list[Any]:
    """An upload body's records array, of any shape: BadRequest unless an object of exactly "records",
    an array of 1..max_count items."""
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


def flat_records(body: bytes, max_count: int) -> list[FlatRecord]:
    """An upload's records as flat tuples; BadRequest naming the first place that is wrong (the GET
    body's exact shape: no unknown or missing field, strings and int32s, a bool no integer)."""
    records = []
    for index, item in enumerate(record_items(body, max_count)):
        try:  # a lookup in anything but an object is a TypeError
            car, driver = item["car"], item["driver"]
            make, model, trim, color = car["make"], car["model"], car["trim"], car["color"]
            year, mileage = car["year"], car["mileage"]
            firstname, lastname, driver_id = driver["firstname"], driver["lastname"], driver["driverId"]
        except (KeyError, TypeError):
            raise BadRequest(_problem(item, f"records[{index}]")) from None
        if not (
            len(item) == 2 and len(car) == 6 and len(driver) == 3
            and type(make) is str and type(model) is str and type(trim) is str and type(color) is str
            and type(year) is int and INT32_MIN <= year <= INT32_MAX
            and type(mileage) is int and INT32_MIN <= mileage <= INT32_MAX
            and type(firstname) is str and type(lastname) is str and type(driver_id) is str
        ):  # fmt: skip
            raise BadRequest(_problem(item, f"records[{index}]"))
        records.append((make, model, trim, color, year, mileage, firstname, lastname, driver_id))
    return records


def _problem(item: Any, place: str) -> str:
    """Why a record failed flat_records' checks: the first unknown or missing field, or wrong value,
    in SHAPE's order."""
    problem = _fields_problem(item, place, SHAPE)
    if problem is not None:
        return problem
    for key, fields in SHAPE.items():
        part, part_place = item[key], f"{place}.{key}"
        problem = _fields_problem(part, part_place, fields)
        if problem is not None:
            return problem
        for name, kind in fields.items():
            value = part[name]
            if kind is str and type(value) is not str:
                return f"{part_place}.{name}: expected a string"
            if kind is int and type(value) is not int:
                return f"{part_place}.{name}: expected an integer"
            if kind is int and not INT32_MIN <= value <= INT32_MAX:
                return f"{part_place}.{name}: expected a 32-bit integer"
    raise AssertionError(f"{place}: refused by flat_records, yet no problem found")


def _fields_problem(value: Any, place: str, names: dict[str, Any]) -> str | None:
    """Why value is not an object of exactly these fields (the first unknown, then the first missing
    one), or None."""
    if type(value) is not dict:
        return f"{place}: expected an object"
    for key in value:
        if key not in names:
            return f"{place}.{key}: unknown field"
    for name in names:
        if name not in value:
            return f"{place}.{name}: missing"
    return None
