"""The lab's httpx caller: GET and POST /records over HTTP/2 and TLS (httpx with h2, the lab's CA),
bodies through orjson and the records' own mapping (services.common.records)."""

import ssl
from collections.abc import Sequence

import httpx
import orjson

from labrunner.callers.harness import CALL_TIMEOUT_S, Reply, serve_calls
from services.common.caller_loop import CallerSettings, run
from services.common.records import Record, json_records, record_from_json

JSON_HEADERS = {"Content-Type": "application/json"}


class HttpxClient:
    def __init__(self, settings: CallerSettings) -> None:
        tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=settings.ca_file) if settings.tls else False
        )
        scheme = "https" if settings.tls else "http"
        # HTTP/2 multiplexes the calls in flight over one connection.
        self._client = httpx.AsyncClient(
            base_url=f"{scheme}://{settings.address}", http2=True, verify=tls, timeout=CALL_TIMEOUT_S
        )

    async def download(self, count: int, offset: int | None = None) -> list[Record]:
        query = f"/records?count={count}" if offset is None else f"/records?count={count}&offset={offset}"
        response = await self._client.get(query)
        response.raise_for_status()
        document = orjson.loads(response.content)
        return [record_from_json(record) for record in document["records"]]

    async def upload(self, records: Sequence[Record]) -> Reply:
        body = orjson.dumps({"records": json_records(records)})
        response = await self._client.post("/records", content=body, headers=JSON_HEADERS)
        response.raise_for_status()
        reply = orjson.loads(response.content)
        return Reply(reply["count"], reply["checksum"])

    async def close(self) -> None:
        await self._client.aclose()


if __name__ == "__main__":
    run(lambda settings: serve_calls(settings, HttpxClient))
