"""grpclib held to a per-connection budget of stream resets (issue 37), for the lab's grpclib server and
its floor alike: a server limit, not harness, so it costs both the same.

At most MAX_RESETS_PER_CONNECTION streams the client resets on one connection
(services/common/h2_budget.py): grpclib starts a task per HEADERS frame and had no such budget, so
rapid reset (CVE-2023-44487) opened and reset streams for free while each one started its handler.
At most 100 streams at once: the h2 library's default MAX_CONCURRENT_STREAMS, which grpclib keeps.

grpclib 0.4.9 (pinned) has no setting for it: its server's protocol class is replaced by a subclass,
in the module that makes one per connection (install()).
"""

from asyncio import BaseTransport

import grpclib.server
from grpclib.protocol import H2Protocol

from services.common.h2_budget import MAX_RESETS_PER_CONNECTION, budget

__all__ = ["MAX_RESETS_PER_CONNECTION", "install"]


class _BudgetedH2Protocol(H2Protocol):
    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(transport)
        budget(self.connection._connection)


def install() -> None:
    """Serve every later connection of this process's grpclib servers with the budgeted protocol."""
    grpclib.server.H2Protocol = _BudgetedH2Protocol  # type: ignore[attr-defined]
