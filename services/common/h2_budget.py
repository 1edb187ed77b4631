"""An h2 connection that ends itself past MAX_RESETS_PER_CONNECTION stream resets from its peer (issue 37,
HTTP/2 rapid reset, CVE-2023-44487), for the servers built on the h2 library (Hypercorn, grpclib; lab
and floor alike: a server limit, not harness).

Only resets of streams still open count: a client may reset a stream it is done with (grpc.aio's did,
in tests/integration/test_grpc_processes.py), which costs the server nothing. The count is kept as h2
parses: the reset past the budget raises h2's DenialOfServiceError, h2 queues GOAWAY
ENHANCE_YOUR_CALM and stops parsing, and the server closes the connection as on any protocol error;
none of the rest of what the client sent is parsed or started. A lab client resets an open stream
only to cancel its call.
"""

from typing import Any

import h2.connection
import h2.exceptions

MAX_RESETS_PER_CONNECTION = 100


class BudgetedH2Connection(h2.connection.H2Connection):
    """h2's connection, refusing the peer's reset past the budget. Servers make their own H2Connection,
    so an instance's class is swapped to this one (budget()), which keeps no state of its own but the
    count."""

    _resets = 0

    def _receive_rst_stream_frame(self, frame: Any) -> Any:
        stream = self.streams.get(frame.stream_id)
        if stream is None or stream.closed:
            return super()._receive_rst_stream_frame(frame)  # a stream already done costs nothing
        self._resets += 1
        if self._resets > MAX_RESETS_PER_CONNECTION:
            raise h2.exceptions.DenialOfServiceError(
                f"more than {MAX_RESETS_PER_CONNECTION} streams reset on one connection"
            )
        return super()._receive_rst_stream_frame(frame)


def budget(connection: h2.connection.H2Connection) -> None:
    """Hold an h2 connection a server made to the reset budget: its class, and the handler its frame
    dispatch table bound at its start."""
    connection.__class__ = BudgetedH2Connection
    table = connection._frame_dispatch_table
    bound = [
        frame_type
        for frame_type, handler in table.items()
        if getattr(handler, "__func__", None) is h2.connection.H2Connection._receive_rst_stream_frame
    ]
    if len(bound) != 1:  # an h2 that dispatches otherwise would leave the budget unenforced
        raise RuntimeError("h2's frame dispatch table has no RST_STREAM handler to hold to the budget")
    table[bound[0]] = connection._receive_rst_stream_frame
