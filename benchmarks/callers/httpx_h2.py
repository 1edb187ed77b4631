"""httpx floor caller: GET and POST /records over HTTP/2 and TLS with httpx (h2) and orjson (see
__init__)."""

import ssl
from collections.abc import Sequence

import httpx
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
    async with httpx.AsyncClient(http2=True, verify=tls) as client:

        async def download(query: str) -> list[Record]:
            document = orjson.loads((await client.get(query)).content)
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
            reply = orjson.loads((await client.post(url, content=body, headers=headers)).content)
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
