"""One connection of the Python driver, for each HTTP version: HTTP/1.1 through aiohttp's client
(http1.py), HTTP/2 through the h2 library (http2.py), HTTP/3 through aioquic's QUIC and H3 connections
(http3.py). Each connection sends one request at a time, as a k6 VU does, and answers what a reply was
(connection.py).

Only the protocol driven is imported: a driver's start counts in its CPU share, as k6's does, and
aiohttp and aioquic cost about 0.1 s of CPU each to import (docs/http3.md).
"""

from pathlib import Path
from urllib.parse import urlsplit

from labrunner.run.drive.connection import HTTP1, HTTP2, PROTOCOLS, Opener


def opener(protocol: str, base_url: str, ca_file: Path | None) -> Opener:
    """How to open one connection of `protocol` to base_url ("https://127.0.0.1:8082"); ValueError when
    the pair cannot be (HTTP/3 without TLS, a protocol not in PROTOCOLS)."""
    parts = urlsplit(base_url)
    if protocol not in PROTOCOLS:
        raise ValueError(f"EXPECT_PROTO={protocol}: want one of {', '.join(PROTOCOLS)}")
    if protocol == HTTP1:
        from labrunner.run.drive.http1 import Http1Connection  # noqa: PLC0415 (the protocol driven)

        return lambda: Http1Connection.open(base_url, ca_file)
    if parts.scheme != "https" or parts.hostname is None or parts.port is None:
        raise ValueError(f"{protocol} needs an https://host:port address, not {base_url}")
    host, port = parts.hostname, parts.port
    if protocol == HTTP2:
        from labrunner.run.drive.http2 import Http2Connection  # noqa: PLC0415 (the protocol driven)

        return lambda: Http2Connection.open(host, port, ca_file)
    from labrunner.run.drive.http3 import Http3Connection  # noqa: PLC0415 (the protocol driven)

    return lambda: Http3Connection.open(host, port, ca_file)
