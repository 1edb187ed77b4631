"""The floors' RecordService messages from flat tuples, as the lab sends them; and an upload's Record
messages turned into flat tuples, answered as the lab answers them."""

from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import Message

from benchmarks.floor.common import BadRequest, FlatRecord, FloorSettings, FloorShape, Records
from services.common.pb import cars_pb2

Request = cars_pb2.ListRecordsRequest


class Messages:
    """ListRecords responses and StreamRecords messages of the shape (cars: Record). build: each call
    fills new messages from its tuples (the fastest way to build a upb message: its fields set in
    place); prebuilt: one record message per pool record made at start, which a response copies in
    (upb cannot share sub-messages)."""

    def __init__(self, settings: FloorSettings, records: Records, shape: FloorShape) -> None:
        self._records = records
        self._fill, self._record, self._list = shape.fill, shape.record_message, shape.list_message
        self._prebuilt: list[Message] | None = None
        if settings.prebuilt:
            built = [self._fill(self._record(), record) for record in records.pool]
            self._prebuilt = built + built[: len(records.window) - len(built)]

    def _slice(self, request: Request) -> tuple[int, int]:
        count = request.count if request.HasField("count") else None
        offset = request.offset if request.HasField("offset") else None
        return self._records.start(count, offset)

    def response(self, request: Request) -> Message:
        """benchmarks.floor.common.BadRequest for a bad count or offset."""
        start, n = self._slice(request)
        if self._prebuilt is not None:
            prebuilt: Message = self._list(records=self._prebuilt[start : start + n])
            return prebuilt
        response: Any = self._list()
        add: Callable[[], Any] = response.records.add
        fill = self._fill
        for record in self._records.window[start : start + n]:
            fill(add(), record)
        built: Message = response
        return built

    def stream(self, request: Request) -> Iterator[Message]:
        """The messages of a StreamRecords call; BadRequest (at once) for a bad count or offset."""
        start, n = self._slice(request)
        if self._prebuilt is not None:
            return iter(self._prebuilt[start : start + n])
        fill, new = self._fill, self._record
        return (fill(new(), record) for record in self._records.window[start : start + n])


def filled(message: cars_pb2.Record, record: FlatRecord) -> cars_pb2.Record:
    make, model, trim, color, year, mileage, firstname, lastname, driver_id = record
    car, driver = message.car, message.driver
    car.make = make
    car.model = model
    car.trim = trim
    car.color = color
    car.year = year
    car.mileage = mileage
    driver.firstname = firstname
    driver.lastname = lastname
    driver.driver_id = driver_id
    return message


def flat_record(message: cars_pb2.Record) -> FlatRecord:
    """The flat tuple of a Record message an upload sent."""
    car, driver = message.car, message.driver
    return (car.make, car.model, car.trim, car.color, car.year, car.mileage,
            driver.firstname, driver.lastname, driver.driver_id)  # fmt: skip


def undecodable(message_type: type[Message]) -> str:
    """The lab's INVALID_ARGUMENT message for bytes that do not parse as a message_type."""
    return f"not a valid {message_type.DESCRIPTOR.full_name} message"


class UploadTooLarge(Exception):
    """An UploadRecords call whose messages together exceed max_request_bytes (RESOURCE_EXHAUSTED)."""


class Uploads:
    """CreateRecords and UploadRecords: each record message a flat tuple (the shape's from_message), the
    reply their count and the shape's checksum; BadRequest (the lab's words) for no record or more
    than max_count, a stream's at its first record over max_count; UploadTooLarge once a stream's
    messages exceed max_request_bytes in total, counted before each is decoded (the lab's bound)."""

    def __init__(self, max_count: int, max_request_bytes: int, shape: FloorShape) -> None:
        self.max_count = max_count
        self.max_request_bytes = max_request_bytes
        self._flat, self._checksum = shape.from_message, shape.checksum

    def counted(self, total: int, size: int) -> int:
        """A stream's bytes so far, total, with a message of size bytes; UploadTooLarge past the bound."""
        total += size
        if total > self.max_request_bytes:
            raise UploadTooLarge(
                f"records: the upload's messages exceed {self.max_request_bytes} bytes in total"
            )
        return total

    def refused(self, count: int) -> BadRequest:
        return BadRequest(f"records: expected 1 to {self.max_count} records, got {count}")

    def create(self, request: Any) -> cars_pb2.CreateRecordsReply:
        count = len(request.records)
        if count < 1 or count > self.max_count:
            raise self.refused(count)
        flat = self._flat
        return self._reply([flat(message) for message in request.records])

    def add(self, records: list[Any], message: Any) -> None:
        """An UploadRecords message appended to the call's records."""
        if len(records) == self.max_count:
            raise self.refused(len(records) + 1)
        records.append(self._flat(message))

    def reply(self, records: list[Any]) -> cars_pb2.CreateRecordsReply:
        """The reply to an UploadRecords call of these records."""
        if not records:
            raise self.refused(0)
        return self._reply(records)

    def _reply(self, records: list[Any]) -> cars_pb2.CreateRecordsReply:
        return cars_pb2.CreateRecordsReply(count=len(records), checksum=self._checksum(records))
