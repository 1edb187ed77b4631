"""The floors' RecordService messages from flat tuples, as the lab sends them."""

from collections.abc import Callable, Iterator

from benchmarks.floor.common import FlatRecord, FloorSettings, Records
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
