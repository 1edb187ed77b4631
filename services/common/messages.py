"""RecordService's protobuf messages from the neutral records, under the response model: what every
gRPC server (grpc.aio, grpclib) sends, as services.common.rest.RecordBodies is what the REST servers send;
and the records an upload (CreateRecords, UploadRecords) sends, turned into neutral records."""

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import Message

from services.common.config import ResponseModel
from services.common.pb import cars_pb2
from services.common.records import BadRequest, Prebuilt, RecordSource

# cars' protobuf mapping lives beside the other shapes'; its names stay importable from here.
from services.common.shapes import CARS, Shape
from services.common.shapes import fill_record as fill_record  # noqa: PLC0414
from services.common.shapes import record_from_message as record_from_message  # noqa: PLC0414


class RecordMessages:
    """ListRecords responses and StreamRecords messages of the shape (cars: Record) under the response
    model (ResponseModel).

    build: each call fills new messages from its neutral records. prebuilt: one record message
    per pool record is built at start; a ListRecords response assembles them (which copies each:
    upb cannot share sub-messages), StreamRecords sends them as they are. The server serializes
    per call either way.
    """

    def __init__(self, source: RecordSource, model: ResponseModel, shape: Shape = CARS) -> None:
        self._source = source
        self._fill = shape.fill
        self._record = shape.record_message
        self._list = shape.list_message

        def build(records: list[Any]) -> list[Message]:
            return [shape.fill(shape.record_message(), record) for record in records]

        self._prebuilt = Prebuilt(source, build) if model is ResponseModel.PREBUILT else None

    def validate(self, request: cars_pb2.ListRecordsRequest) -> tuple[int, int | None]:
        """The request's (count, offset) with the defaults applied; BadRequest for a bad value."""
        count = request.count if request.HasField("count") else None
        offset = request.offset if request.HasField("offset") else None
        return self._source.validate(count, offset)

    def response(self, count: int, offset: int | None) -> Message:
        """The ListRecords response (the shape's list message) for valid (count, offset)."""
        if self._prebuilt is not None:
            return self._list(records=self._prebuilt.objects(count, offset))
        response: Message = self._list()
        add = response.records.add  # type: ignore[attr-defined]  # every shape's list message has records
        fill = self._fill
        for record in self._source.records(count, offset):
            fill(add(), record)
        return response

    def stream(self, count: int, offset: int | None) -> Iterator[Message]:
        """The StreamRecords messages (the shape's record message) for valid (count, offset)."""
        if self._prebuilt is not None:
            yield from self._prebuilt.objects(count, offset)
        else:
            fill, new = self._fill, self._record
            for record in self._source.records(count, offset):
                message: Message = fill(new(), record)
                yield message


def undecodable(message_type: type[Message]) -> str:
    """The INVALID_ARGUMENT message for bytes that do not parse as a message_type."""
    return f"not a valid {message_type.DESCRIPTOR.full_name} message"


class UploadTooLarge(Exception):
    """An UploadRecords call whose messages together exceed max_request_bytes (RESOURCE_EXHAUSTED)."""


class RecordUploads:
    """CreateRecords and UploadRecords: every record message received becomes a neutral record (the
    shape's from_message, cars: record_from_message); the reply holds their count and the shape's
    checksum. BadRequest for no record or
    more than max_count (a stream is refused at its first record over max_count); UploadTooLarge for
    a stream whose messages' bytes together exceed max_request_bytes, the bound of a whole REST body
    and of one gRPC message, so that no call holds more than that (issue 37)."""

    def __init__(self, max_count: int, max_request_bytes: int, shape: Shape = CARS) -> None:
        self.max_count = max_count
        self.max_request_bytes = max_request_bytes
        self.from_message = shape.from_message
        self.record_message = shape.record_message
        self.checksum = shape.checksum

    def refused(self, count: int) -> BadRequest:
        """The error for an upload of count records, out of 1..max_count."""
        return BadRequest(f"records: expected 1 to {self.max_count} records, got {count}")

    def create(self, request: Any) -> cars_pb2.CreateRecordsReply:
        """The reply to a CreateRecords request (the shape's create message)."""
        count = len(request.records)
        if count < 1 or count > self.max_count:
            raise self.refused(count)
        from_message = self.from_message
        return self.reply([from_message(message) for message in request.records])

    def reply(self, records: list[Any]) -> cars_pb2.CreateRecordsReply:
        return cars_pb2.CreateRecordsReply(count=len(records), checksum=self.checksum(records))

    def start(self) -> "Upload":
        """An UploadRecords call's records, none until its messages arrive."""
        return Upload(self)


class Upload:
    """One UploadRecords call: its records so far, and the bytes of their messages."""

    __slots__ = ("_bytes", "_records", "_uploads")

    def __init__(self, uploads: RecordUploads) -> None:
        self._uploads = uploads
        self._records: list[Any] = []
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
        self.add(self._uploads.record_message.FromString(data))

    def add(self, message: Any) -> None:
        """A decoded message (the shape's record message), its bytes already counted (count)."""
        if len(self._records) == self._uploads.max_count:
            raise self._uploads.refused(len(self._records) + 1)
        self._records.append(self._uploads.from_message(message))

    def reply(self) -> cars_pb2.CreateRecordsReply:
        """The reply once the client has sent its last message."""
        if not self._records:
            raise self._uploads.refused(0)
        return self._uploads.reply(self._records)
