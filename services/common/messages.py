"""RecordService's protobuf messages from the neutral records, under the response model: what every
gRPC server (grpc.aio, grpclib) sends, as services.common.rest.RecordBodies is what the REST servers send."""

from collections.abc import Iterator

from services.common.config import ResponseModel
from services.common.pb import cars_pb2
from services.common.records import Prebuilt, Record, RecordSource


def fill_record(message: cars_pb2.Record, record: Record) -> cars_pb2.Record:
    """Set a Record message's fields from a neutral record, in place.

    Filling the messages response.records.add() makes is the fastest way found to build a
    response: 2-3x faster than making Record(car=Car(...), ...) per record, which the response
    then copies, and ~20% faster than constructing it from dicts.
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
