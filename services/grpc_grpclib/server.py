"""The grpclib worker: RecordService, health and reflection on a uvloop event loop.

Stop: grpclib's Server.close() cancels the calls in flight, so the drain is done here:
SIGTERM turns health to NOT_SERVING for SHUTDOWN_DRAIN_SECONDS; then the listener closes,
new RecordService calls on open connections get UNAVAILABLE (as after grpc.aio's stop),
the calls in flight get SHUTDOWN_GRACE_SECONDS to finish, and close() cancels what is left.
grpclib sends no GOAWAY: the open connections end with the worker.
"""

import asyncio
import contextlib
import signal

import uvloop
from grpclib.health.check import ServiceStatus
from grpclib.health.service import Health
from grpclib.reflection.service import ServerReflection
from grpclib.server import Server

from services.common import grpclib_limits
from services.common.metrics import MetricBatch, worker_metrics
from services.common.rest import LISTEN_BACKLOG
from services.common.shapes import shape_kit
from services.common.supervisor import WorkerContext, listen_socket
from services.common.tls import count_handshakes, server_ssl_context
from services.grpc_grpclib.metrics import InstrumentedServicer
from services.grpc_grpclib.servicer import Calls, Codec, RecordService
from services.grpc_grpclib.wire import install as install_bounded_receive


async def _serve(context: WorkerContext, batch: MetricBatch | None) -> None:
    settings = context.settings
    calls = Calls(settings.grpc_max_concurrent_rpcs)
    shape = shape_kit(settings.shape)
    service = RecordService(
        context.records, settings.response_model, settings.max_request_bytes, calls, shape
    )
    records = service if batch is None else InstrumentedServicer(service, batch)
    serving = ServiceStatus()
    serving.set(True)
    health = Health({records: [serving]})  # also the whole server's ("") status
    server = Server(ServerReflection.extend([records, health]), codec=Codec(settings.max_request_bytes))

    sock = listen_socket(context, LISTEN_BACKLOG)
    ssl = server_ssl_context(settings, ["h2"])
    if ssl is not None and batch is not None:
        count_handshakes(ssl)
        batch.tls_handshakes()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with contextlib.nullcontext() if batch is None else batch.flushing():
        await server.start(sock=sock, ssl=ssl, backlog=LISTEN_BACKLOG)
        context.report_listening(sock.getsockname()[1])
        await stopping.wait()

        # Health first, so clients and load balancers move away while requests still succeed.
        serving.set(False)
        await asyncio.sleep(settings.shutdown_drain_seconds)
        # grpclib 0.4.9 (pinned) has no call that only stops accepting: close its asyncio server.
        assert server._server is not None
        server._server.close()
        await calls.stop(settings.shutdown_grace_seconds)
        server.close()
        await asyncio.sleep(0)  # the cancelled calls record their status


def worker_main(context: WorkerContext) -> None:
    """One worker process: serve until SIGTERM, drain, finish in-flight calls, return (exit 0)."""
    install_bounded_receive()
    grpclib_limits.install()
    with worker_metrics(context.settings.metrics_enabled) as batch:
        uvloop.run(_serve(context, batch))
