"""Hypercorn held to a per-connection budget (issue 37), for the lab's Quart server and its floor alike:
a server limit, not harness, so it costs both the same.

- At most MAX_RESETS_PER_CONNECTION streams the client resets on one HTTP/2 connection
  (services/common/h2_budget.py): rapid reset (CVE-2023-44487) opens and resets streams for free,
  while each one still runs its handler.
- At most MAX_REQUESTS_PER_CONNECTION requests a connection (Hypercorn's keep_alive_max_requests),
  HTTP/1.1 or HTTP/2; docs/services.md says what that means for a k6 VU's connection.
- HTTP/2 only where TLS negotiated it by ALPN: Hypercorn would otherwise switch any HTTP/1.1
  connection to HTTP/2 on a prior-knowledge preface or an h2c upgrade, also on targets that offer
  HTTP/1.1 only. The preface is then an HTTP/1.1 request Hypercorn refuses (4xx), and the upgrade
  header is ignored.

Hypercorn 0.18 (pinned) has no setting for the first and third: its protocol classes are replaced by
subclasses, in the module that picks them per connection, in each process that serves (install()).
"""

from typing import Any

import hypercorn.protocol
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol

from services.common.h2_budget import MAX_RESETS_PER_CONNECTION, budget

MAX_REQUESTS_PER_CONNECTION = 100_000
__all__ = ["MAX_REQUESTS_PER_CONNECTION", "MAX_RESETS_PER_CONNECTION", "install"]


class _BudgetedH2Protocol(H2Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        budget(self.connection)


class _H11Only(H11Protocol):
    async def _check_protocol(self, event: Any) -> None:
        """Never switch to HTTP/2 (Hypercorn's own would, on a preface or an h2c upgrade)."""


def install() -> None:
    """Serve every later connection of this process with the budgeted protocols."""
    hypercorn.protocol.H2Protocol = _BudgetedH2Protocol  # type: ignore[attr-defined]
    hypercorn.protocol.H11Protocol = _H11Only  # type: ignore[attr-defined]
