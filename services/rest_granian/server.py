"""The Granian worker: the Quart app of services.rest_quart on Granian's embedded server.

Why the same Quart app, not a minimal ASGI or RSGI app: the lab compares the two servers at
equal protocol (Hypercorn against Granian, over HTTP/1.1 and HTTP/2), so everything above
the server (routing, JSON errors, the record bodies, the request metrics) is the same code
on both, and a difference between the quart-* and granian-* targets is the server's: its
HTTP stack, pure Python in Hypercorn, Rust (hyper) here. A bare RSGI app would be faster,
but would change the framework as well as the server.

Processes: the lab's supervisor forks the workers (sized from the cgroup quota), serves
/metrics and forwards SIGTERM, as for aiohttp and grpc.aio, instead of Granian's own process
manager, which binds the port in every worker from an address: with PORT=0 each worker would
get a port of its own, and none is reported. Here each worker binds the port itself (port 0
is resolved once by the supervisor; SO_REUSEPORT only with several workers) and hands the
socket to granian.server.embed.Server, whose accept loop and HTTP stack run on a Rust thread
and call the app on the worker's uvloop.

Stop: SIGTERM turns /healthz to 503 for SHUTDOWN_DRAIN_SECONDS; then Granian stops accepting,
lets in-flight requests finish (within SHUTDOWN_GRACE_SECONDS) and only then runs the app's
lifespan shutdown, which writes the last metrics.
"""

import asyncio
import logging
import signal
import socket
from typing import Any

import uvloop
from granian._granian import SocketHolder
from granian.constants import HTTPModes, Interfaces, SSLProtocols
from granian.http import HTTP1Settings, HTTP2Settings
from granian.log import LogLevels
from granian.server.embed import Server
from quart import Quart

from services.common.config import Settings
from services.common.rest import LISTEN_BACKLOG, Health
from services.common.supervisor import WorkerContext, listen_socket
from services.rest_quart.app import build_app

log = logging.getLogger("protolab.rest_granian")

# ALPN_PROTOCOLS -> Granian's HTTP mode, which decides what its TLS offers (cleartext HTTP/2
# is h2c with prior knowledge, which no target uses).
_HTTP_MODES: dict[tuple[str, ...], HTTPModes] = {
    ("http/1.1",): HTTPModes.http1,
    ("h2",): HTTPModes.http2,
}
GRANIAN_MAX_CONNECTIONS = 65_536
# Hypercorn's HTTP/2 limits (services/rest_quart/hypercorn.toml), so both servers offer the same.
_HTTP2 = HTTP2Settings(max_concurrent_streams=100, max_headers_size=65536, max_frame_size=16384)
# Granian logs to stdout by default, where the listening line must be the only output.
_LOGGING = {
    "handlers": {
        "console": {"formatter": "generic", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
    }
}


class _SocketServer(Server):
    """Granian's embedded server on a socket opened here: Granian 2.8 binds from an address and
    port only, so its socket set-up is replaced by a holder of this one (which Granian closes)."""

    def __init__(self, sock: socket.socket, **options: Any) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(address=host, port=port, **options)
        self._socket = sock

    def _init_shared_socket(self) -> None:
        self._ssp = None
        # Granian's stub declares neither SocketHolder's arguments nor this attribute's type.
        self._shd = SocketHolder(self._socket.detach(), False, LISTEN_BACKLOG)  # type: ignore[call-arg,assignment]


def _granian(app: Quart, settings: Settings, sock: socket.socket) -> _SocketServer:
    return _SocketServer(
        sock,
        target=app,
        interface=Interfaces.ASGI,  # with the lifespan: Quart's serving hooks run
        # Cleartext is HTTP/1.1 only: no target speaks h2c, and prior knowledge would give any client
        # HTTP/2 on a target that offers HTTP/1.1 (issue 37).
        http=_HTTP_MODES.get(settings.alpn_protocols, HTTPModes.auto) if settings.tls else HTTPModes.http1,
        websockets=False,
        backlog=LISTEN_BACKLOG,
        # Granian holds at most backlog / workers connections at once (1,024) and leaves the rest in the
        # kernel's queue: 5,000 idle clients locked everyone else out for as long as Granian keeps an
        # idle one (its header_read_timeout, 30 s). Hypercorn and aiohttp hold every connection.
        backpressure=GRANIAN_MAX_CONNECTIONS,
        http1_settings=HTTP1Settings(),
        http2_settings=_HTTP2,
        log_level=LogLevels.warning,
        log_dictconfig=_LOGGING,
        ssl_cert=settings.tls_cert_file,
        ssl_key=settings.tls_key_file,
        ssl_protocol_min=SSLProtocols.tls12,  # as Hypercorn and aiohttp; clients still negotiate 1.3
    )


async def _serve(context: WorkerContext) -> None:
    settings = context.settings
    health = Health()
    app = build_app(settings, context.records, health)
    sock = listen_socket(context, LISTEN_BACKLOG)
    port = sock.getsockname()[1]

    @app.before_serving
    async def started() -> None:
        # The lifespan start-up is done; Granian serves the (already listening) socket next.
        context.report_listening(port)

    server = _granian(app, settings, sock)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    serving = asyncio.create_task(server.serve())
    signalled = asyncio.create_task(stopping.wait())
    await asyncio.wait({serving, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()  # an error of Granian's raises here
        raise RuntimeError("Granian stopped before SIGTERM; see its error above")

    # Health first, so clients and load balancers move away while requests still succeed.
    health.start_draining()
    await asyncio.sleep(settings.shutdown_drain_seconds)
    server.stop()  # type: ignore[no-untyped-call]
    try:
        await asyncio.wait_for(serving, settings.shutdown_grace_seconds)
    except TimeoutError:
        log.warning("grace period over: the requests still in flight are cut")


def worker_main(context: WorkerContext) -> None:
    """One worker process: serve until SIGTERM, drain, finish in-flight requests, return (exit 0)."""
    uvloop.run(_serve(context))
