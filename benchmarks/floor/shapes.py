"""The floors' record shapes (SHAPE): each shape's flat tuples, JSON documents, protobuf fill, upload
decoding and checksum, written for the floor as a skilled engineer would, none of the lab's serving
code (services/common/shapes.py is the lab's); the same bytes on the wire and the same answers.
cars' own functions stay where they were (bodies, messages, uploads, common); a floor takes its shape
once, at start, as the lab's servers do."""

from collections.abc import Sequence
from typing import Any

from benchmarks.floor import bodies, messages, uploads
from benchmarks.floor.common import BadRequest, Flat, FloorShape, checksum
from services.common.pb import cars_pb2
from services.common.shape_pool import NUMERIC_DOUBLES, NUMERIC_INTS, TEXT_FIELDS

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _cars_flat(record: dict[str, Any]) -> Flat:
    car, driver = record["car"], record["driver"]
    return (car["make"], car["model"], car["trim"], car["color"], car["year"], car["mileage"],
            driver["firstname"], driver["lastname"], driver["driverId"])  # fmt: skip


# --- numeric


def _numeric_flat(record: dict[str, Any]) -> Flat:
    return (*(record[name] for name in NUMERIC_INTS), *(float(record[name]) for name in NUMERIC_DOUBLES))


def _numeric_documents(records: Sequence[Flat]) -> list[dict[str, Any]]:
    return [
        {"id": a, "timestampMs": b, "sequence": c, "accountId": d, "quantity": e, "volume": f,
         "openInterest": g, "tradeCount": h, "price": i, "bid": j, "ask": k, "open": o_, "high": m,
         "low": n, "close": o, "vwap": p}
        for a, b, c, d, e, f, g, h, i, j, k, o_, m, n, o, p in records
    ]  # fmt: skip


def _numeric_fill(message: Any, record: Flat) -> Any:
    (message.id, message.timestamp_ms, message.sequence, message.account_id, message.quantity,
     message.volume, message.open_interest, message.trade_count, message.price, message.bid, message.ask,
     message.open, message.high, message.low, message.close, message.vwap) = record  # fmt: skip
    return message


def _numeric_from_message(m: Any) -> Flat:
    return (m.id, m.timestamp_ms, m.sequence, m.account_id, m.quantity, m.volume, m.open_interest,
            m.trade_count, m.price, m.bid, m.ask, m.open, m.high, m.low, m.close, m.vwap)  # fmt: skip


def _numeric_checksum(records: Sequence[Flat]) -> int:
    total = 0
    for record in records:
        total += sum(record[:8]) + sum(round(value * 1000) for value in record[8:])
    return total & 0xFFFFFFFF


# --- text


def _text_flat(record: dict[str, Any]) -> Flat:
    return tuple(record[name] for name in TEXT_FIELDS)


def _text_documents(records: Sequence[Flat]) -> list[dict[str, Any]]:
    return [
        {"title": title, "author": author, "language": language, "slug": slug, "body": body}
        for title, author, language, slug, body in records
    ]


def _text_fill(message: Any, record: Flat) -> Any:
    message.title, message.author, message.language, message.slug, message.body = record
    return message


def _text_from_message(m: Any) -> Flat:
    return (m.title, m.author, m.language, m.slug, m.body)


def _text_checksum(records: Sequence[Flat]) -> int:
    return sum(len(a) + len(b) + len(c) + len(d) + len(e) for a, b, c, d, e in records) & 0xFFFFFFFF


# --- nested


def _nested_flat(record: dict[str, Any]) -> Flat:
    items = tuple((item["sku"], item["quantity"], float(item["price"])) for item in record["items"])
    return (record["orderId"], items, tuple(sorted(record["attributes"].items())))


def _nested_documents(records: Sequence[Flat]) -> list[dict[str, Any]]:
    return [
        {
            "orderId": order_id,
            "items": [{"sku": sku, "quantity": quantity, "price": price} for sku, quantity, price in items],
            "attributes": dict(attributes),
        }
        for order_id, items, attributes in records
    ]


def _nested_fill(message: Any, record: Flat) -> Any:
    order_id, items, attributes = record
    message.order_id = order_id
    add = message.items.add
    for sku, quantity, price in items:
        item = add()
        item.sku, item.quantity, item.price = sku, quantity, price
    message.attributes.update(attributes)
    return message


def _nested_from_message(m: Any) -> Flat:
    items = tuple((item.sku, item.quantity, item.price) for item in m.items)
    return (m.order_id, items, tuple(sorted(m.attributes.items())))


def _nested_checksum(records: Sequence[Flat]) -> int:
    total = 0
    for order_id, items, attributes in records:
        total += len(order_id)
        for sku, quantity, price in items:
            total += len(sku) + quantity + round(price * 100)
        for key, value in attributes:
            total += len(key) + len(value)
    return total & 0xFFFFFFFF


# --- a REST upload's body, in the lab's words


def _exactly(value: Any, place: str, names: Sequence[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise BadRequest(f"{place}: expected an object")
    for key in value:
        if key not in names:
            raise BadRequest(f"{place}.{key}: unknown field")
    for name in names:
        if name not in value:
            raise BadRequest(f"{place}.{name}: missing")
    return value


def _str(value: Any, place: str) -> str:
    if type(value) is not str:
        raise BadRequest(f"{place}: expected a string")
    return value


def _int(value: Any, place: str, low: int, high: int, bits: int) -> int:
    if type(value) is not int:
        raise BadRequest(f"{place}: expected an integer")
    if not low <= value <= high:
        raise BadRequest(f"{place}: expected a {bits}-bit integer")
    return value


def _float(value: Any, place: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise BadRequest(f"{place}: expected a number")
    return float(value)


def _numeric_body(body: bytes, max_count: int) -> list[Flat]:
    names = NUMERIC_INTS + NUMERIC_DOUBLES
    records = []
    for index, item in enumerate(uploads.record_items(body, max_count)):
        place = f"records[{index}]"
        record = _exactly(item, place, names)
        ints = (_int(record[n], f"{place}.{n}", INT64_MIN, INT64_MAX, 64) for n in NUMERIC_INTS)
        records.append((*ints, *(_float(record[n], f"{place}.{n}") for n in NUMERIC_DOUBLES)))
    return records


def _text_body(body: bytes, max_count: int) -> list[Flat]:
    records = []
    for index, item in enumerate(uploads.record_items(body, max_count)):
        place = f"records[{index}]"
        record = _exactly(item, place, TEXT_FIELDS)
        records.append(tuple(_str(record[name], f"{place}.{name}") for name in TEXT_FIELDS))
    return records


def _nested_body(body: bytes, max_count: int) -> list[Flat]:
    records = []
    for index, item in enumerate(uploads.record_items(body, max_count)):
        place = f"records[{index}]"
        record = _exactly(item, place, ("orderId", "items", "attributes"))
        if type(record["items"]) is not list:
            raise BadRequest(f"{place}.items: expected an array")
        items = []
        for number, value in enumerate(record["items"]):
            at = f"{place}.items[{number}]"
            line = _exactly(value, at, ("sku", "quantity", "price"))
            items.append(
                (
                    _str(line["sku"], f"{at}.sku"),
                    _int(line["quantity"], f"{at}.quantity", INT32_MIN, INT32_MAX, 32),
                    _float(line["price"], f"{at}.price"),
                )
            )
        attributes = record["attributes"]
        if type(attributes) is not dict:
            raise BadRequest(f"{place}.attributes: expected an object")
        entries = sorted((key, _str(value, f"{place}.attributes.{key}")) for key, value in attributes.items())
        records.append((_str(record["orderId"], f"{place}.orderId"), tuple(items), tuple(entries)))
    return records


def _service(name: str) -> str:
    return cars_pb2.DESCRIPTOR.services_by_name[name].full_name


FLOOR_SHAPES = {
    "cars": FloorShape(
        _service("RecordService"),
        cars_pb2.Record,
        cars_pb2.ListRecordsResponse,
        cars_pb2.CreateRecordsRequest,
        _cars_flat,
        bodies.documents,
        messages.filled,
        messages.flat_record,
        checksum,
        uploads.flat_records,
    ),
    "numeric": FloorShape(
        _service("NumericRecordService"),
        cars_pb2.NumericRecord,
        cars_pb2.NumericRecordList,
        cars_pb2.CreateNumericRecordsRequest,
        _numeric_flat,
        _numeric_documents,
        _numeric_fill,
        _numeric_from_message,
        _numeric_checksum,
        _numeric_body,
    ),
    "text": FloorShape(
        _service("TextRecordService"),
        cars_pb2.TextRecord,
        cars_pb2.TextRecordList,
        cars_pb2.CreateTextRecordsRequest,
        _text_flat,
        _text_documents,
        _text_fill,
        _text_from_message,
        _text_checksum,
        _text_body,
    ),
    "nested": FloorShape(
        _service("NestedRecordService"),
        cars_pb2.NestedRecord,
        cars_pb2.NestedRecordList,
        cars_pb2.CreateNestedRecordsRequest,
        _nested_flat,
        _nested_documents,
        _nested_fill,
        _nested_from_message,
        _nested_checksum,
        _nested_body,
    ),
}
