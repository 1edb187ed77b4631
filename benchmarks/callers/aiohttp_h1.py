"""aiohttp floor caller: GET and POST /records with aiohttp's client session and orjson (see __init__)."""

import ssl
from collections.abc import Sequence

import aiohttp
import orjson

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
from services.common.records import Car, Driver, Record


async def main(settings: CallerSettings) -> None:
    pool = pool_records(settings)
    batches = Batches(pool, settings.count)
    tls: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=settings.ca_file) if settings.tls else False
    )
    url = f"{'https' if settings.tls else 'http'}://{settings.address}/records"
    listed = f"{url}?count={settings.count}"
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=settings.concurrency, ssl=tls)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def download(query: str) -> list[Record]:
            async with session.get(query) as response:
                document = orjson.loads(await response.read())
            records = []
            for record in document["records"]:
                car, driver = record["car"], record["driver"]
                records.append(
                    Record(Car(**car), Driver(driver["firstname"], driver["lastname"], driver["driverId"]))
                )
            return records

        async def upload(records: Sequence[Record]) -> tuple[int, int]:
            body = orjson.dumps(
                {
                    "records": [
                        {
                            "car": {
                                "make": make,
                                "model": model,
                                "trim": trim,
                                "color": color,
                                "year": year,
                                "mileage": mileage,
                            },
                            "driver": {"firstname": firstname, "lastname": lastname, "driverId": driver_id},
                        }
                        for (make, model, trim, color, year, mileage), (
                            firstname,
                            lastname,
                            driver_id,
                        ) in records
                    ]
                }
            )
            async with session.post(url, data=body, headers=headers) as response:
                reply = orjson.loads(await response.read())
            return reply["count"], reply["checksum"]

        async def verify_at(offset: int) -> list[Record]:
            return await download(f"{listed}&offset={offset}")

        await verify(settings, pool, verify_at, upload)
        if settings.direction == DOWNLOAD:
            window = await measure(settings, lambda: download(listed))
        else:
            window = await measure(settings, lambda: upload(batches.next()))
        measured(window)


if __name__ == "__main__":
    run(main)
