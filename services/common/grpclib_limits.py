"""grpclib held to a per-connection budget of stream resets (issue 37), for the lab's grpclib server and
its floor alike: a server limit, not harness, so it costs both the same.

At most MAX_RESETS_PER_CONNECTION streams the client resets (RST_STREAM) on one connection; past it
the connection ends with GOAWAY ENHANCE_YOUR_CALM, before the data that crossed it starts a stream.
grpclib starts a task per HEADERS frame and has no such budget: rapid reset (CVE-2023-44487) opens and
resets streams for free while each one starts its handler. No lab client resets streams: a gRPC
client resets one only to cancel a call. At most 100 streams at once: the h2 library's default
MAX_CONCURRENT_STREAMS, which grpclib keeps and h2 enforces.

grpclib 0.4.9 (pinned) has no setting for it: its server's protocol class is replaced by a subclass,
in the module that makes one per connection (install()).
"""

from typing import Any

import grpclib.server
import h2.errors
import h2.events
import h2.exceptions
from grpclib.protocol import H2Protocol

MAX_RESETS_PER_CONNECTION = 100


class _BudgetedH2Protocol(H2Protocol):
    _resets = 0

    def data_received(self, data: bytes) -> None:
        if self._resets > MAX_RESETS_PER_CONNECTION:
            return  # the connection is closing
        try:
            events = self.connection.feed(data)
        except h2.exceptions.ProtocolError:
            self.processor.close("Protocol error")  # as grpclib's own data_received
            return
        self._resets += sum(
            1 for event in events if isinstance(event, h2.events.StreamReset) and event.remote_reset
        )
        if self._resets > MAX_RESETS_PER_CONNECTION:
            h2_connection: Any = self.connection._connection
            h2_connection.close_connection(error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            self.connection.flush()
            self.processor.close("too many streams reset")
            return
        self.connection.flush()
        for event in events:
            self.processor.process(event)
        self.connection.flush()


def install() -> None:
    """Serve every later connection of this process's grpclib servers with the budgeted protocol."""
    grpclib.server.H2Protocol = _BudgetedH2Protocol  # type: ignore[attr-defined]
