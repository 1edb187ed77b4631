"""The floors' RecordService messages from flat tuples, as the lab sends them; and an upload's Record
messages turned into flat tuples, answered as the lab answers them."""

from collections.abc import Callable, Iterator

from benchmarks.floor.common import BadRequest, FlatRecord, FloorSettings, Records, checksum
from services.common.pb import cars_pb2

Request = cars_pb2.ListRecordsRequest


class Messages:
    """ListRecords responses and StreamRecords messages. build: each call fills new messages from its
    tuples (the fastest way to build a upb message: its fields set in place); prebuilt: one Record per
    pool record made at start, which a response copies in (upb cannot share sub-messages)."""

    def __init__(self, settings: FloorSettings, records: Records) -> None:
        self._records = records
        self._prebuilt: list[cars_pb2.Record] | None = None
        if settings.prebuilt:
            built = [_filled(cars_pb2.Record(), record) for record in records.pool]
            self._prebuilt = built + built[: len(records.window) - len(built)]

    def _slice(self, request: Request) -> tuple[int, int]:
        count = request.count if request.HasField("count") else None
        offset = request.offset if request.HasField("offset") else None
        return self._records.start(count, offset)

    def response(self, request: Request) -> cars_pb2.ListRecordsResponse:
        """benchmarks.floor.common.BadRequest for a bad count or offset."""
        start, n = self._slice(request)
        if self._prebuilt is not None:
            return cars_pb2.ListRecordsResponse(records=self._prebuilt[start : start + n])
        response = cars_pb2.ListRecordsResponse()
        add: Callable[[], cars_pb2.Record] = response.records.add
        for record in self._records.window[start : start + n]:
            _filled(add(), record)
        return response

    def stream(self, request: Request) -> Iterator[cars_pb2.Record]:
        """The messages of a StreamRecords call; BadRequest (at once) for a bad count or offset."""
        start, n = self._slice(request)
        if self._prebuilt is not None:
            return iter(self._prebuilt[start : start + n])
        return (_filled(cars_pb2.Record(), record) for record in self._records.window[start : start + n])


def _filled(message: cars_pb2.Record, record: FlatRecord) -> cars_pb2.Record:
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


def undecodable(
    message_type: type[cars_pb2.ListRecordsRequest | cars_pb2.CreateRecordsRequest | cars_pb2.Record],
) -> str:
    """The lab's INVALID_ARGUMENT message for bytes that do not parse as a message_type."""
    return f"not a valid {message_type.DESCRIPTOR.full_name} message"


class UploadTooLarge(Exception):
    """An UploadRecords call whose messages together exceed max_request_bytes (RESOURCE_EXHAUSTED)."""


class Uploads:
    """CreateRecords and UploadRecords: each Record message a flat tuple, the reply their count and
    checksum; BadRequest (the lab's words) for no record or more than max_count, a stream's at its
    first record over max_count; UploadTooLarge once a stream's messages exceed max_request_bytes in
    total, counted before each is decoded (the lab's bound)."""

    def __init__(self, max_count: int, max_request_bytes: int) -> None:
        self.max_count = max_count
        self.max_request_bytes = max_request_bytes

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

    def create(self, request: cars_pb2.CreateRecordsRequest) -> cars_pb2.CreateRecordsReply:
        count = len(request.records)
        if count < 1 or count > self.max_count:
            raise self.refused(count)
        return _reply([flat_record(message) for message in request.records])

    def add(self, records: list[FlatRecord], message: cars_pb2.Record) -> None:
        """An UploadRecords message appended to the call's records."""
        if len(records) == self.max_count:
            raise self.refused(len(records) + 1)
        records.append(flat_record(message))

    def reply(self, records: list[FlatRecord]) -> cars_pb2.CreateRecordsReply:
        """The reply to an UploadRecords call of these records."""
        if not records:
            raise self.refused(0)
        return _reply(records)


def _reply(records: list[FlatRecord]) -> cars_pb2.CreateRecordsReply:
    return cars_pb2.CreateRecordsReply(count=len(records), checksum=checksum(records))
