"""The abuse suite's TLS case, on every lab server that serves TLS (the floors serve cleartext only), in
its cgroup at the small profile's limits: TLS 1.0 and 1.1, and TLS 1.2 with only weak ciphers (3DES,
RC4, no encryption), are refused at the handshake; TLS 1.2 and 1.3 with the defaults are accepted; the
server stays alive, under its memory limit (docs/guarantees.md)."""

import socket
import ssl
import warnings

import pytest

from tests.integration.abuse_support import CERTS, GRPC_MODULES, REST_MODULES, confined
from tests.support import tls_env

MODULES = [*REST_MODULES, *GRPC_MODULES]
WEAK_CIPHERS = "3DES:RC4:eNULL:aNULL:EXPORT:@SECLEVEL=0"

pytestmark = [pytest.mark.timeout(120), pytest.mark.paired]  # servers under CPU quotas, no figure judged


def _context(minimum: ssl.TLSVersion, maximum: ssl.TLSVersion, ciphers: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(CERTS / "ca.pem"))
    with warnings.catch_warnings():  # TLS 1.0 and 1.1 are deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        if ciphers is not None or minimum < ssl.TLSVersion.TLSv1_2:
            context.set_ciphers(ciphers or "DEFAULT:@SECLEVEL=0")
        context.minimum_version = minimum
        context.maximum_version = maximum
    return context


def _handshake(port: int, context: ssl.SSLContext) -> str:
    """The negotiated version, or the error's class name."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            with context.wrap_socket(sock, server_hostname="localhost") as tls:
                return str(tls.version())
        except (ssl.SSLError, ConnectionError) as error:
            return type(error).__name__


@pytest.mark.parametrize("module", MODULES)
def test_old_tls_and_weak_ciphers_are_refused(module: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = {
            "TLSv1": _context(ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1),
            "TLSv1.1": _context(ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1),
            "TLSv1.2 weak ciphers": _context(ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2, WEAK_CIPHERS),
        }
    with confined("services", module, tls_env()) as server:
        server.reset_peak()
        port = server.service.port
        refused = {name: _handshake(port, context) for name, context in old.items()}
        accepted = {
            "TLSv1.2": _handshake(port, _context(ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)),
            "TLSv1.3": _handshake(port, _context(ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)),
        }
        print(f"\n{module}: refused {refused}, accepted {accepted}")
        assert all(not answer.startswith("TLS") for answer in refused.values()), refused
        assert accepted == {"TLSv1.2": "TLSv1.2", "TLSv1.3": "TLSv1.3"}, accepted
        server.unharmed()
