"""The lab's aiohttp caller: GET and POST /records over HTTP/1.1 with aiohttp's client session, bodies
through orjson and the records' own mapping (services.common.records)."""

import ssl
from collections.abc import Sequence

import aiohttp
import orjson

from labrunner.callers.harness import CALL_TIMEOUT_S, Reply, serve_calls
from services.common.caller_loop import CallerSettings, run
from services.common.records import Record, json_records, record_from_json

JSON_HEADERS = {"Content-Type": "application/json"}


class AiohttpClient:
    def __init__(self, settings: CallerSettings) -> None:
        tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=settings.ca_file) if settings.tls else False
        )
        scheme = "https" if settings.tls else "http"
        self._session = aiohttp.ClientSession(
            f"{scheme}://{settings.address}",
            # One connection per call in flight, kept alive.
            connector=aiohttp.TCPConnector(limit=settings.concurrency, ssl=tls),
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
        )

    async def download(self, count: int, offset: int | None = None) -> list[Record]:
        query = f"/records?count={count}" if offset is None else f"/records?count={count}&offset={offset}"
        async with self._session.get(query) as response:
            response.raise_for_status()
            document = orjson.loads(await response.read())
        return [record_from_json(record) for record in document["records"]]

    async def upload(self, records: Sequence[Record]) -> Reply:
        body = orjson.dumps({"records": json_records(records)})
        async with self._session.post("/records", data=body, headers=JSON_HEADERS) as response:
            response.raise_for_status()
            reply = orjson.loads(await response.read())
        return Reply(reply["count"], reply["checksum"])

    async def close(self) -> None:
        await self._session.close()


if __name__ == "__main__":
    run(lambda settings: serve_calls(settings, AiohttpClient))
