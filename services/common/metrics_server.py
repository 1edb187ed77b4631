"""/metrics from the supervisor on one asyncio thread, bounded: at most MAX_CONNECTIONS at once (more are
closed on accept), each given REQUEST_TIMEOUT_SECONDS for its request and answer and MAX_HEAD_BYTES of
request head, one request per connection (issue 37: prometheus_client's start_http_server ran a thread
per connection with no timeout, so idle clients piled up threads in the process every worker depends on).
"""

import asyncio
import logging
import socket
import threading
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from services.common.config import SECONDS

log = logging.getLogger("protolab.metrics")
MAX_CONNECTIONS = 16  # Prometheus scrapes one at a time; a few more for people and health checks
REQUEST_TIMEOUT_SECONDS = 5 * SECONDS  # for the whole exchange, request head to the last byte sent
MAX_HEAD_BYTES = 8 * 1024
_BACKLOG = 64


def start_bounded_metrics_server(host: str, port: int, registry: CollectorRegistry) -> int:
    """Serve registry at /metrics on host:port from a daemon thread; the bound port (port 0 picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
    server = _MetricsServer(registry)
    threading.Thread(target=asyncio.run, args=(server.serve(sock),), name="metrics", daemon=True).start()
    return int(sock.getsockname()[1])


class _MetricsServer:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._open = 0
        # Connections still waiting for their request head, oldest first: a new connection past
        # MAX_CONNECTIONS takes the oldest one's place, so idle clients cannot lock a scrape out.
        self._waiting: dict[asyncio.StreamWriter, None] = {}

    async def serve(self, sock: socket.socket) -> None:
        server = await asyncio.start_server(self._connection, sock=sock, limit=MAX_HEAD_BYTES)
        async with server:
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            if not self._waiting:
                writer.transport.abort()
                return
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.abort()  # its read fails, and its handler lets go of its place
        self._open += 1
        self._waiting[writer] = None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
                self._waiting.pop(writer, None)
                writer.write(self._answer(head))
                writer.close()  # Connection: close, once what is buffered is sent
                await writer.wait_closed()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a slow, short or oversized request, or a client gone: nothing to answer
        finally:
            self._open -= 1
            self._waiting.pop(writer, None)
            writer.transport.abort()  # no-op once closed; else what a client does not read is dropped

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _response("400 Bad Request", "text/plain", b"bad request\n")
        method, target = parts[0], parts[1]
        if method not in {"GET", "HEAD"}:
            return _response("405 Method Not Allowed", "text/plain", b"method not allowed\n")
        if urlsplit(target).path != "/metrics":
            return _response("404 Not Found", "text/plain", b"not found\n")
        accept = next(
            (line.partition(":")[2].strip() for line in lines[1:] if line.lower().startswith("accept:")), ""
        )
        encoder, content_type = choose_encoder(accept)
        try:
            body = encoder(self._registry)
        except Exception:
            log.exception("collecting the metrics failed")
            return _response("500 Internal Server Error", "text/plain", b"collection failed\n")
        return _response("200 OK", content_type, b"" if method == "HEAD" else body, len(body))


def _response(status: str, content_type: str, body: bytes, length: int | None = None) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
