"""RecordService's protobuf messages from the neutral records, under the response model: what every
gRPC server (grpc.aio, grpclib) sends, as services.common.rest.RecordBodies is what the REST servers send;
and the records an upload (CreateRecords, UploadRecords) sends, turned into neutral records."""

from collections.abc import Iterator

from google.protobuf.message import Message

from services.common.config import ResponseModel
from services.common.pb import cars_pb2
from services.common.records import BadRequest, Car, Driver, Prebuilt, Record, RecordSource, checksum


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


def new_record_message(record: Record) -> cars_pb2.Record:
    return fill_record(cars_pb2.Record(), record)


def new_record_messages(records: list[Record]) -> list[cars_pb2.Record]:
    return [fill_record(cars_pb2.Record(), record) for record in records]


class RecordMessages:
    """ListRecords responses and StreamRecords messages under the response model (ResponseModel).

    build: each call fills new messages from its neutral records. prebuilt: one Record message
    per pool record is built at start; a ListRecords response assembles them (which copies each:
    upb cannot share sub-messages), StreamRecords sends them as they are. The server serializes
    per call either way.
    """

    def __init__(self, source: RecordSource, model: ResponseModel) -> None:
        self._source = source
        self._prebuilt = Prebuilt(source, new_record_messages) if model is ResponseModel.PREBUILT else None

    def validate(self, request: cars_pb2.ListRecordsRequest) -> tuple[int, int | None]:
        """The request's (count, offset) with the defaults applied; BadRequest for a bad value."""
        count = request.count if request.HasField("count") else None
        offset = request.offset if request.HasField("offset") else None
        return self._source.validate(count, offset)

    def response(self, count: int, offset: int | None) -> cars_pb2.ListRecordsResponse:
        """The ListRecords response for valid (count, offset)."""
        if self._prebuilt is not None:
            return cars_pb2.ListRecordsResponse(records=self._prebuilt.objects(count, offset))
        response = cars_pb2.ListRecordsResponse()
        add = response.records.add
        for record in self._source.records(count, offset):
            fill_record(add(), record)
        return response

    def stream(self, count: int, offset: int | None) -> Iterator[cars_pb2.Record]:
        """The StreamRecords messages for valid (count, offset)."""
        if self._prebuilt is not None:
            yield from self._prebuilt.objects(count, offset)
        else:
            for record in self._source.records(count, offset):
                yield new_record_message(record)


def record_from_message(message: cars_pb2.Record) -> Record:
    """The neutral record of a Record message an upload sent (an unset car or driver reads as empty)."""
    car, driver = message.car, message.driver
    return Record(
        Car(car.make, car.model, car.trim, car.color, car.year, car.mileage),
        Driver(driver.firstname, driver.lastname, driver.driver_id),
    )


def undecodable(message_type: type[Message]) -> str:
    """The INVALID_ARGUMENT message for bytes that do not parse as a message_type."""
    return f"not a valid {message_type.DESCRIPTOR.full_name} message"


class UploadTooLarge(Exception):
    """An UploadRecords call whose messages together exceed max_request_bytes (RESOURCE_EXHAUSTED)."""


class RecordUploads:
    """CreateRecords and UploadRecords: every Record message received becomes a neutral record
    (record_from_message); the reply holds their count and checksum. BadRequest for no record or
    more than max_count (a stream is refused at its first record over max_count); UploadTooLarge for
    a stream whose messages' bytes together exceed max_request_bytes, the bound of a whole REST body
    and of one gRPC message, so that no call holds more than that (issue 37)."""

    def __init__(self, max_count: int, max_request_bytes: int) -> None:
        self.max_count = max_count
        self.max_request_bytes = max_request_bytes

    def refused(self, count: int) -> BadRequest:
        """The error for an upload of count records, out of 1..max_count."""
        return BadRequest(f"records: expected 1 to {self.max_count} records, got {count}")

    def create(self, request: cars_pb2.CreateRecordsRequest) -> cars_pb2.CreateRecordsReply:
        """The reply to a CreateRecords request."""
        count = len(request.records)
        if count < 1 or count > self.max_count:
            raise self.refused(count)
        return _reply([record_from_message(message) for message in request.records])

    def start(self) -> "Upload":
        """An UploadRecords call's records, none until its messages arrive."""
        return Upload(self)


class Upload:
    """One UploadRecords call: its records so far, and the bytes of their messages."""

    __slots__ = ("_bytes", "_records", "_uploads")

    def __init__(self, uploads: RecordUploads) -> None:
        self._uploads = uploads
        self._records: list[Record] = []
        self._bytes = 0

    def count(self, size: int) -> None:
        """Count a message of size bytes before it is decoded; UploadTooLarge past the call's bound."""
        self._bytes += size
        if self._bytes > self._uploads.max_request_bytes:
            limit = self._uploads.max_request_bytes
            raise UploadTooLarge(f"records: the upload's messages exceed {limit} bytes in total")

    def add_bytes(self, data: bytes) -> None:
        """A message's bytes: counted, then decoded (DecodeError when they do not parse) and added."""
        self.count(len(data))
        self.add(cars_pb2.Record.FromString(data))

    def add(self, message: cars_pb2.Record) -> None:
        """A decoded message, its bytes already counted (count)."""
        if len(self._records) == self._uploads.max_count:
            raise self._uploads.refused(len(self._records) + 1)
        self._records.append(record_from_message(message))

    def reply(self) -> cars_pb2.CreateRecordsReply:
        """The reply once the client has sent its last message."""
        if not self._records:
            raise self._uploads.refused(0)
        return _reply(self._records)


def _reply(records: list[Record]) -> cars_pb2.CreateRecordsReply:
    return cars_pb2.CreateRecordsReply(count=len(records), checksum=checksum(records))
