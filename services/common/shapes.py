"""The record shapes a server can serve (SHAPE: cars, numeric, text, nested), each as one Shape: its
neutral form (NamedTuples, as services.common.records' cars), its JSON and protobuf mappings, the
checksum of an upload's reply and the REST upload's decoder.

A service serves one shape for its whole life (SHAPE, read once at start), so a request pays no
branch on the shape: the servers hold the Shape's functions and call them as they called cars' own.
Every server maps the same neutral records with these same functions: equal work within a shape.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from services.common.pb import cars_pb2
from services.common.pool import DEFAULT_SHAPE, SHAPES, JsonRecord
from services.common.records import BadRequest, Car, Driver, Record, checksum, json_records, record_from_json
from services.common.shape_pool import NUMERIC_DOUBLES, NUMERIC_INTS, TEXT_FIELDS

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class NumericRecord(NamedTuple):
    id: int
    timestamp_ms: int
    sequence: int
    account_id: int
    quantity: int
    volume: int
    open_interest: int
    trade_count: int
    price: float
    bid: float
    ask: float
    open: float
    high: float
    low: float
    close: float
    vwap: float


class TextRecord(NamedTuple):
    title: str
    author: str
    language: str
    slug: str
    body: str


class LineItem(NamedTuple):
    sku: str
    quantity: int
    price: float


class NestedRecord(NamedTuple):
    order_id: str
    items: tuple[LineItem, ...]
    # The map's entries sorted by key: a protobuf map keeps no order, so the neutral record fixes one
    # (the pool's JSON writes them in that order too).
    attributes: tuple[tuple[str, str], ...]


# --- cars: services.common.records' neutral form; its protobuf mapping lives here so every shape's does


def fill_record(message: cars_pb2.Record, record: Record) -> cars_pb2.Record:
    """Set a Record message's fields from a neutral record, in place.

    Filling the messages response.records.add() makes is the fastest way found to build a
    response, ahead of making Record(car=Car(...), ...) per record (which the response then
    copies) and of constructing it from dicts: the figures, dated, in docs/services.md (The servers).
    """
    car, driver = record
    car_message, driver_message = message.car, message.driver
    car_message.make = car.make
    car_message.model = car.model
    car_message.trim = car.trim
    car_message.color = car.color
    car_message.year = car.year
    car_message.mileage = car.mileage
    driver_message.firstname = driver.firstname
    driver_message.lastname = driver.lastname
    driver_message.driver_id = driver.driver_id
    return message


def record_from_message(message: cars_pb2.Record) -> Record:
    """The neutral record of a Record message an upload sent (an unset car or driver reads as empty)."""
    car, driver = message.car, message.driver
    return Record(
        Car(car.make, car.model, car.trim, car.color, car.year, car.mileage),
        Driver(driver.firstname, driver.lastname, driver.driver_id),
    )


# --- numeric


def numeric_from_json(record: JsonRecord) -> NumericRecord:
    return NumericRecord(
        *(record[name] for name in NUMERIC_INTS), *(float(record[n]) for n in NUMERIC_DOUBLES)
    )


def numeric_json(records: Sequence[NumericRecord]) -> list[JsonRecord]:
    """The records as the REST body holds them (int64 as JSON numbers: proto/cars.proto says why)."""
    return [
        {
            "id": id_,
            "timestampMs": timestamp_ms,
            "sequence": sequence,
            "accountId": account_id,
            "quantity": quantity,
            "volume": volume,
            "openInterest": open_interest,
            "tradeCount": trade_count,
            "price": price,
            "bid": bid,
            "ask": ask,
            "open": open_,
            "high": high,
            "low": low,
            "close": close,
            "vwap": vwap,
        }
        for (
            id_,
            timestamp_ms,
            sequence,
            account_id,
            quantity,
            volume,
            open_interest,
            trade_count,
            price,
            bid,
            ask,
            open_,
            high,
            low,
            close,
            vwap,
        ) in records
    ]


def fill_numeric(message: cars_pb2.NumericRecord, record: NumericRecord) -> cars_pb2.NumericRecord:
    (
        message.id,
        message.timestamp_ms,
        message.sequence,
        message.account_id,
        message.quantity,
        message.volume,
        message.open_interest,
        message.trade_count,
        message.price,
        message.bid,
        message.ask,
        message.open,
        message.high,
        message.low,
        message.close,
        message.vwap,
    ) = record
    return message


def numeric_from_message(m: cars_pb2.NumericRecord) -> NumericRecord:
    return NumericRecord(
        m.id,
        m.timestamp_ms,
        m.sequence,
        m.account_id,
        m.quantity,
        m.volume,
        m.open_interest,
        m.trade_count,
        m.price,
        m.bid,
        m.ask,
        m.open,
        m.high,
        m.low,
        m.close,
        m.vwap,
    )


def numeric_checksum(records: Iterable[NumericRecord]) -> int:
    """The eight ints and the eight doubles read in thousandths (the pool's doubles have three
    decimals), summed modulo 2**32: k6/lib/common.js computes the same for an upload."""
    total = 0
    for record in records:
        total += sum(record[:8]) + sum(round(value * 1000) for value in record[8:])
    return total & 0xFFFFFFFF


# --- text


def text_from_json(record: JsonRecord) -> TextRecord:
    return TextRecord(*(record[name] for name in TEXT_FIELDS))


def text_json(records: Sequence[TextRecord]) -> list[JsonRecord]:
    return [
        {"title": title, "author": author, "language": language, "slug": slug, "body": body}
        for title, author, language, slug, body in records
    ]


def fill_text(message: cars_pb2.TextRecord, record: TextRecord) -> cars_pb2.TextRecord:
    message.title, message.author, message.language, message.slug, message.body = record
    return message


def text_from_message(m: cars_pb2.TextRecord) -> TextRecord:
    return TextRecord(m.title, m.author, m.language, m.slug, m.body)


def text_checksum(records: Iterable[TextRecord]) -> int:
    """The lengths of the five strings, summed modulo 2**32 (as cars' strings are counted)."""
    total = 0
    for title, author, language, slug, body in records:
        total += len(title) + len(author) + len(language) + len(slug) + len(body)
    return total & 0xFFFFFFFF


# --- nested


def nested_from_json(record: JsonRecord) -> NestedRecord:
    items = tuple(LineItem(item["sku"], item["quantity"], float(item["price"])) for item in record["items"])
    return NestedRecord(record["orderId"], items, tuple(sorted(record["attributes"].items())))


def nested_json(records: Sequence[NestedRecord]) -> list[JsonRecord]:
    return [
        {
            "orderId": order_id,
            "items": [{"sku": sku, "quantity": quantity, "price": price} for sku, quantity, price in items],
            "attributes": dict(attributes),
        }
        for order_id, items, attributes in records
    ]


def fill_nested(message: cars_pb2.NestedRecord, record: NestedRecord) -> cars_pb2.NestedRecord:
    order_id, items, attributes = record
    message.order_id = order_id
    add = message.items.add
    for sku, quantity, price in items:
        item = add()
        item.sku, item.quantity, item.price = sku, quantity, price
    message.attributes.update(attributes)
    return message


def nested_from_message(m: cars_pb2.NestedRecord) -> NestedRecord:
    items = tuple(LineItem(item.sku, item.quantity, item.price) for item in m.items)
    return NestedRecord(m.order_id, items, tuple(sorted(m.attributes.items())))


def nested_checksum(records: Iterable[NestedRecord]) -> int:
    """The id's length; each item's sku length, quantity and price in hundredths (the pool's prices
    have two decimals); each attribute's key and value lengths; summed modulo 2**32."""
    total = 0
    for order_id, items, attributes in records:
        total += len(order_id)
        for sku, quantity, price in items:
            total += len(sku) + quantity + round(price * 100)
        for key, value in attributes:
            total += len(key) + len(value)
    return total & 0xFFFFFFFF


# --- the REST upload's decoder of the shapes beside cars (cars': services.common.rest.records_from_body)


def _object(value: Any, place: str, names: Sequence[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise BadRequest(f"{place}: expected an object")
    for key in value:
        if key not in names:
            raise BadRequest(f"{place}.{key}: unknown field")
    for name in names:
        if name not in value:
            raise BadRequest(f"{place}.{name}: missing")
    return value


def _string(value: Any, place: str) -> str:
    if type(value) is not str:
        raise BadRequest(f"{place}: expected a string")
    return value


def _integer(value: Any, place: str, low: int, high: int, bits: int) -> int:
    if type(value) is not int:
        raise BadRequest(f"{place}: expected an integer")
    if not low <= value <= high:
        raise BadRequest(f"{place}: expected a {bits}-bit integer")
    return value


def _number(value: Any, place: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise BadRequest(f"{place}: expected a number")
    return float(value)


def numeric_from_upload(item: Any, place: str) -> NumericRecord:
    record = _object(item, place, NUMERIC_INTS + NUMERIC_DOUBLES)
    ints = (_integer(record[name], f"{place}.{name}", INT64_MIN, INT64_MAX, 64) for name in NUMERIC_INTS)
    doubles = (_number(record[name], f"{place}.{name}") for name in NUMERIC_DOUBLES)
    return NumericRecord(*ints, *doubles)


def text_from_upload(item: Any, place: str) -> TextRecord:
    record = _object(item, place, TEXT_FIELDS)
    return TextRecord(*(_string(record[name], f"{place}.{name}") for name in TEXT_FIELDS))


def nested_from_upload(item: Any, place: str) -> NestedRecord:
    record = _object(item, place, ("orderId", "items", "attributes"))
    items = record["items"]
    if type(items) is not list:
        raise BadRequest(f"{place}.items: expected an array")
    line_items = []
    for index, value in enumerate(items):
        item_place = f"{place}.items[{index}]"
        line = _object(value, item_place, ("sku", "quantity", "price"))
        line_items.append(
            LineItem(
                _string(line["sku"], f"{item_place}.sku"),
                _integer(line["quantity"], f"{item_place}.quantity", INT32_MIN, INT32_MAX, 32),
                _number(line["price"], f"{item_place}.price"),
            )
        )
    attributes = record["attributes"]
    if type(attributes) is not dict:
        raise BadRequest(f"{place}.attributes: expected an object")
    entries = tuple(
        sorted((key, _string(value, f"{place}.attributes.{key}")) for key, value in attributes.items())
    )
    return NestedRecord(_string(record["orderId"], f"{place}.orderId"), tuple(line_items), entries)


@dataclass(frozen=True)
class Shape:
    """One record shape: everything a server does with it, chosen once at start."""

    name: str
    service: ServiceDescriptor  # RecordService, or the shape's own service with the same four methods
    record_message: type[Message]  # what StreamRecords sends and UploadRecords receives
    list_message: type[Message]  # what ListRecords answers
    create_message: type[Message]  # what CreateRecords receives
    from_json: Callable[[JsonRecord], Any]  # the pool's JSON -> the neutral record
    to_json: Callable[[Sequence[Any]], list[JsonRecord]]  # neutral records -> the REST body's records
    fill: Callable[[Any, Any], Any]  # (a record message, a neutral record) -> the message, filled
    from_message: Callable[[Any], Any]  # a record message an upload sent -> the neutral record
    checksum: Callable[[Iterable[Any]], int]  # an upload reply's checksum of the neutral records
    # An upload's record (a decoded JSON value) at a place ("records[3]") -> the neutral record, or
    # BadRequest naming the place; None for cars, whose decoder is unrolled in services.common.rest.
    from_upload: Callable[[Any, str], Any] | None


def _service(name: str) -> ServiceDescriptor:
    return cars_pb2.DESCRIPTOR.services_by_name[name]


CARS = Shape(
    "cars",
    _service("RecordService"),
    cars_pb2.Record,
    cars_pb2.ListRecordsResponse,
    cars_pb2.CreateRecordsRequest,
    record_from_json,
    json_records,
    fill_record,
    record_from_message,
    checksum,
    None,
)
SHAPE_KITS: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        CARS,
        Shape(
            "numeric",
            _service("NumericRecordService"),
            cars_pb2.NumericRecord,
            cars_pb2.NumericRecordList,
            cars_pb2.CreateNumericRecordsRequest,
            numeric_from_json,
            numeric_json,
            fill_numeric,
            numeric_from_message,
            numeric_checksum,
            numeric_from_upload,
        ),
        Shape(
            "text",
            _service("TextRecordService"),
            cars_pb2.TextRecord,
            cars_pb2.TextRecordList,
            cars_pb2.CreateTextRecordsRequest,
            text_from_json,
            text_json,
            fill_text,
            text_from_message,
            text_checksum,
            text_from_upload,
        ),
        Shape(
            "nested",
            _service("NestedRecordService"),
            cars_pb2.NestedRecord,
            cars_pb2.NestedRecordList,
            cars_pb2.CreateNestedRecordsRequest,
            nested_from_json,
            nested_json,
            fill_nested,
            nested_from_message,
            nested_checksum,
            nested_from_upload,
        ),
    )
}


def shape_kit(name: str = DEFAULT_SHAPE) -> Shape:
    """The Shape of that name; ValueError naming the shapes for another."""
    try:
        return SHAPE_KITS[name]
    except KeyError:
        raise ValueError(f"shape {name!r} is not one of {', '.join(SHAPES)}") from None
