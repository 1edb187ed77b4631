"""The TLS settings of the servers whose TLS runs in Python's ssl module, in one place."""

import ssl
from collections.abc import Sequence

from services.common.config import Settings


def server_ssl_context(settings: Settings, alpn_protocols: Sequence[str]) -> ssl.SSLContext | None:
    """The server's TLS context offering alpn_protocols; None when the settings ask for no TLS.

    Hypercorn's TLS settings, so the servers pay for the same handshakes and ciphers.
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
