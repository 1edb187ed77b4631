"""The TLS settings of the servers whose TLS runs in Python's ssl module, in one place, and the
count of their handshakes.

aiohttp and grpclib serve with server_ssl_context; Hypercorn makes its own context (the same
settings) in each worker, and services.rest_quart.server counts its handshakes with
count_handshakes too. Granian (rustls) and grpc.aio (gRPC core) do TLS outside Python: nothing
here sees their handshakes.
"""

import ssl
from collections.abc import Sequence
from typing import ClassVar

from services.common.config import Settings


def server_ssl_context(settings: Settings, alpn_protocols: Sequence[str]) -> ssl.SSLContext | None:
    """The server's TLS context offering alpn_protocols; None when the settings ask for no TLS.

    Hypercorn's TLS settings, so the servers pay for the same handshakes and ciphers. Resumption is
    on, as Python's server contexts have it: TLS 1.3 session tickets (num_tickets, 2 per handshake),
    TLS 1.2 tickets, and TLS 1.2 session ids (Python sets the session id context a server's cache
    needs). A ticket is sealed with the keys of the context that issued it, so with several workers
    (a context each) only the worker that issued it resumes it: docs/services.md, Metrics.
    """
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE+AESGCM")
    context.options |= ssl.OP_NO_COMPRESSION
    context.set_alpn_protocols(list(alpn_protocols))
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


class HandshakeCounts:
    """Server-side TLS handshakes completed since the last take(): full, and resumed (a session ticket
    or a TLS 1.2 session id let the client skip the key exchange and the certificate)."""

    __slots__ = ("full", "resumed")

    def __init__(self) -> None:
        self.full = 0
        self.resumed = 0

    def take(self) -> tuple[int, int]:
        """(full, resumed) since the last take, and start again from zero."""
        taken = self.full, self.resumed
        self.full = self.resumed = 0
        return taken


# This process's handshakes, on every context count_handshakes set up, until its metrics take them
# (services.common.metrics.TlsHandshakes). One per process, as a handshake is: Hypercorn makes its
# context where the metrics cannot hand it anything. A worker's handshakes and its metrics' flushes
# run on its event loop's thread, so nothing needs a lock.
HANDSHAKES = HandshakeCounts()


class CountingSSLObject(ssl.SSLObject):
    """An SSLObject that counts its handshake into `counts` once it has completed.

    asyncio's and uvloop's SSL protocols make a context's SSLObjects with context.wrap_bio, which
    creates an instance of context.sslobject_class, and call do_handshake until it stops raising
    SSLWantReadError (three calls for a TLS 1.3 handshake here); a handshake that fails raises
    SSLError and is not counted. Its cost per handshake: docs/services.md, Metrics.
    """

    counts: ClassVar[HandshakeCounts] = HANDSHAKES
    _counted = False  # an instance's own True once it has counted

    def do_handshake(self) -> None:
        super().do_handshake()
        if not self._counted:
            self._counted = True
            if self.session_reused:
                self.counts.resumed += 1
            else:
                self.counts.full += 1


def count_handshakes(context: ssl.SSLContext) -> ssl.SSLContext:
    """context, its server-side handshakes from now on counted into HANDSHAKES."""
    context.sslobject_class = CountingSSLObject
    return context
