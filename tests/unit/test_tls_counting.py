"""services.common.tls's handshake count, in memory: a client and a server SSLObject over MemoryBIOs on
the lab's server context, full handshakes, then resumed ones (TLS 1.3 and 1.2 tickets, a TLS 1.2 session
id); and the metric the worker writes the counts into (services.common.metrics.TlsHandshakes)."""

import contextlib
import ssl
from pathlib import Path

import pytest
from labrunner import certs as lab_certs
from prometheus_client import Metric

from services.common.config import load_settings
from services.common.metrics import MetricBatch
from services.common.tls import (
    HANDSHAKES,
    CountingSSLObject,
    HandshakeCounts,
    count_handshakes,
    server_ssl_context,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    lab_certs.ensure_certs(directory)
    return directory


@pytest.fixture
def server_context(certs: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """The lab's server context (server_ssl_context), as aiohttp's worker gets it from its environment."""
    monkeypatch.setenv("TLS_CERT_FILE", str(certs / "server.pem"))
    monkeypatch.setenv("TLS_KEY_FILE", str(certs / "server-key.pem"))
    context = server_ssl_context(load_settings("rest_aiohttp"), ["http/1.1"])
    assert context is not None
    return context


@pytest.fixture
def counts(server_context: ssl.SSLContext) -> HandshakeCounts:
    """The server context's handshakes counted into counts of the test's own (not the process's)."""

    class Counted(CountingSSLObject):
        counts = HandshakeCounts()

    server_context.sslobject_class = Counted
    return Counted.counts


def client_context(certs: Path, tls12: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs / "ca.pem")
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


class Connection:
    """A client and a server SSLObject, each writing into a MemoryBIO the other reads."""

    def __init__(
        self, server: ssl.SSLContext, client: ssl.SSLContext, session: ssl.SSLSession | None = None
    ) -> None:
        self._to_server, self._to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._server_out, self._client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = server.wrap_bio(self._to_server, self._server_out, server_side=True)
        self.client = client.wrap_bio(
            self._to_client, self._client_out, server_hostname="localhost", session=session
        )

    def carry(self) -> None:
        """Deliver what each side has written to the other."""
        self._to_server.write(self._client_out.read())
        self._to_client.write(self._server_out.read())

    def step(self, side: ssl.SSLObject) -> bool:
        """One do_handshake call of side, then carry: whether its handshake has completed."""
        try:
            side.do_handshake()
        except ssl.SSLWantReadError:
            return False
        finally:
            self.carry()
        return True

    def handshake(self) -> None:
        """Both sides' handshakes, then the client reads what followed (the server's session tickets)."""
        client_done = server_done = False
        for _ in range(10):
            client_done = client_done or self.step(self.client)
            server_done = server_done or self.step(self.server)
            if client_done and server_done:
                break
        assert client_done and server_done
        with pytest.raises(ssl.SSLWantReadError):
            self.client.read()  # no application data: only the tickets, which fill client.session

    def close_cleanly(self) -> None:
        """Each side's close_notify, as aiohttp's and Hypercorn's connections end."""
        for side in (self.server, self.client, self.server):
            with contextlib.suppress(ssl.SSLWantReadError):  # until the other side's close_notify
                side.unwrap()
            self.carry()


def connect(
    server: ssl.SSLContext, client: ssl.SSLContext, session: ssl.SSLSession | None = None
) -> Connection:
    connection = Connection(server, client, session)
    connection.handshake()
    assert connection.server.session_reused is connection.client.session_reused
    return connection


def test_the_lab_context_offers_session_tickets(server_context: ssl.SSLContext) -> None:
    assert server_context.num_tickets >= 1  # TLS 1.3 tickets after each handshake (Python's default: 2)
    assert not server_context.options & ssl.OP_NO_TICKET  # and TLS 1.2 tickets


def test_full_then_resumed_handshakes_are_counted_apart(
    server_context: ssl.SSLContext, counts: HandshakeCounts, certs: Path
) -> None:
    client = client_context(certs)
    full = [connect(server_context, client) for _ in range(2)]
    assert (counts.full, counts.resumed) == (2, 0)
    resumed = [connect(server_context, client, full[-1].client.session) for _ in range(3)]
    assert all(connection.server.session_reused for connection in resumed)
    assert resumed[0].server.version() == "TLSv1.3"
    assert (counts.full, counts.resumed) == (2, 3)
    assert counts.take() == (2, 3)
    assert (counts.full, counts.resumed) == (0, 0)


def test_only_a_completed_handshake_counts_and_only_once(
    server_context: ssl.SSLContext, counts: HandshakeCounts, certs: Path
) -> None:
    connection = Connection(server_context, client_context(certs))
    assert not connection.step(connection.client)  # ClientHello
    assert not connection.step(connection.server)  # the server's flight, waiting for the client's Finished
    assert (counts.full, counts.resumed) == (0, 0)
    assert connection.step(connection.client)
    assert connection.step(connection.server)
    assert (counts.full, counts.resumed) == (1, 0)
    connection.server.do_handshake()  # a call after completion returns at once, and counts nothing
    assert (counts.full, counts.resumed) == (1, 0)


def test_a_failed_handshake_counts_nothing(
    server_context: ssl.SSLContext, counts: HandshakeCounts, certs: Path
) -> None:
    client = ssl.create_default_context(cafile=certs / "ca.pem")
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    client.set_ciphers("ECDHE+CHACHA20")  # no cipher the server accepts (ECDHE+AESGCM)
    connection = Connection(server_context, client)
    assert not connection.step(connection.client)
    with pytest.raises(ssl.SSLError):
        connection.step(connection.server)
    assert (counts.full, counts.resumed) == (0, 0)


@pytest.mark.parametrize("tickets", [True, False], ids=["ticket", "session-id"])
def test_tls12_resumption_is_counted(
    server_context: ssl.SSLContext, counts: HandshakeCounts, certs: Path, tickets: bool
) -> None:
    """TLS 1.2 resumes from a ticket, or from the server's session cache by session id (the client
    asks for no ticket): Python sets the session id context that cache needs. OpenSSL keeps a session
    in that cache only after a clean close (close_notify sent), as the lab's servers close."""
    client = client_context(certs, tls12=True)
    if not tickets:
        client.options |= ssl.OP_NO_TICKET
    first = connect(server_context, client)
    assert first.server.version() == "TLSv1.2"
    first.close_cleanly()
    second = connect(server_context, client, first.client.session)
    assert second.server.session_reused
    assert (counts.full, counts.resumed) == (1, 1)


def test_count_handshakes_counts_into_the_process_counts(server_context: ssl.SSLContext, certs: Path) -> None:
    assert count_handshakes(server_context) is server_context
    assert server_context.sslobject_class is CountingSSLObject
    client = client_context(certs)
    HANDSHAKES.take()  # from zero, whatever this process counted before
    first = connect(server_context, client)
    connect(server_context, client, first.client.session)
    assert HANDSHAKES.take() == (1, 1)


def samples(metric: Metric) -> dict[str, float]:
    """The resumed label's value -> the counter's total."""
    return {s.labels["resumed"]: s.value for s in metric.samples if s.name.endswith("_total")}


def test_the_metric_has_both_series_from_the_start_and_adds_each_flush() -> None:
    counts = HandshakeCounts()
    batch = MetricBatch()
    series = batch.tls_handshakes(counts)
    (metric,) = series.counter.collect()
    assert metric.name == "protolab_tls_handshakes"
    assert samples(metric) == {"false": 0, "true": 0}
    counts.full, counts.resumed = 3, 2
    assert samples(next(iter(series.counter.collect()))) == {"false": 0, "true": 0}  # until the flush
    batch.flush()
    assert samples(next(iter(series.counter.collect()))) == {"false": 3, "true": 2}
    assert (counts.full, counts.resumed) == (0, 0)
    counts.resumed = 1
    batch.flush()
    batch.flush()
    assert samples(next(iter(series.counter.collect()))) == {"false": 3, "true": 3}
