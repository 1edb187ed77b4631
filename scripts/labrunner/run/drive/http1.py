"""HTTP/1.1 for the Python driver: one aiohttp connection (a connector of one)."""

from pathlib import Path

import aiohttp

from labrunner.run.drive.connection import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, Reply, tls_context


class Http1Connection:
    """HTTP/1.1 on one aiohttp connection (a connector of one); aiohttp's client parser is C."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base_url = base_url

    @classmethod
    async def open(cls, base_url: str, ca_file: Path | None) -> "Http1Connection":
        tls = tls_context(ca_file, "http/1.1") if base_url.startswith("https") else False
        connector = aiohttp.TCPConnector(limit=1, ssl=tls)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        connection = cls(session, base_url.rstrip("/"))
        # Connected (and TLS done) before the clock starts, as a VU's: aiohttp connects only for a
        # request, so this one, to /healthz, is one more request the server serves for each
        # connection (under CHURN, one a churned connection: docs/http3.md).
        try:
            await connection.get("/healthz")
        except BaseException:
            await session.close()  # a connection that never was leaves no session behind
            raise
        return connection

    async def get(self, path: str) -> Reply:
        async with self._session.get(self._base_url + path) as response:
            body = await response.read()
            header_bytes = sum(len(k) + len(v) + 4 for k, v in response.raw_headers)
            version = (
                "" if response.version is None else f"HTTP/{response.version.major}.{response.version.minor}"
            )
            return Reply(response.status, body, header_bytes, version)

    async def close(self) -> None:
        await self._session.close()
