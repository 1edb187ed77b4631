"""grpc.aio floor caller: ListRecords and CreateRecords through the generated stub (see __init__)."""

from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio

from services.common.caller_loop import (
    DOWNLOAD,
    Batches,
    CallerSettings,
    measure,
    measured,
    pool_records,
    run,
    verify,
)
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import Car, Driver, Record


async def main(settings: CallerSettings) -> None:
    pool = pool_records(settings)
    batches = Batches(pool, settings.count)
    if settings.ca_file is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(settings.ca_file).read_bytes())
        channel = grpc.aio.secure_channel(settings.address, credentials)
    else:
        channel = grpc.aio.insecure_channel(settings.address)
    async with channel:
        stub = cars_pb2_grpc.RecordServiceStub(channel)
        listed = cars_pb2.ListRecordsRequest(count=settings.count)

        async def download(request: cars_pb2.ListRecordsRequest) -> list[Record]:
            records = []
            for message in (await stub.ListRecords(request)).records:
                car, driver = message.car, message.driver
                records.append(
                    Record(
                        Car(car.make, car.model, car.trim, car.color, car.year, car.mileage),
                        Driver(driver.firstname, driver.lastname, driver.driver_id),
                    )
                )
            return records

        async def upload(records: Sequence[Record]) -> tuple[int, int]:
            request = cars_pb2.CreateRecordsRequest()
            add = request.records.add
            for (make, model, trim, color, year, mileage), (firstname, lastname, driver_id) in records:
                message = add()
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
            reply = await stub.CreateRecords(request)
            return reply.count, reply.checksum

        async def verify_at(offset: int) -> list[Record]:
            return await download(cars_pb2.ListRecordsRequest(count=settings.count, offset=offset))

        await verify(settings, pool, verify_at, upload)
        if settings.direction == DOWNLOAD:
            window = await measure(settings, lambda: download(listed))
        else:
            window = await measure(settings, lambda: upload(batches.next()))
        measured(window)


if __name__ == "__main__":
    run(main)
