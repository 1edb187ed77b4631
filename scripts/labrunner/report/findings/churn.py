"""The churn question's answers: what one new connection costs each server, and what a TLS
handshake adds, from CPU per call fitted against connections per call (report.connection_cost)."""

from labrunner.model.scenario import churn_name
from labrunner.report.connection_cost import (
    ConnectionCost,
    Handshake,
    connection_costs,
    handshakes,
    microseconds,
)
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.findings.pairs import CHURN

QUESTION = CHURN  # its answers stand before the pairs' lines under the one heading


def findings(evidence: Evidence) -> list[Finding]:
    """One answer per set of conditions the churns ran under: each target's cost of a new connection,
    then each TLS target's handshake over its cleartext twin; [] for a run with no churn."""
    costs = connection_costs(evidence.groups)
    if not costs:
        return []
    found = [_target_finding(c) for c in costs]
    found += [_handshake_finding(h) for h in handshakes(costs)]
    return found


def _target_finding(c: ConnectionCost) -> Finding:
    """E.g. "aiohttp-h1-tls: a new connection costs 2,100 µs [1,900, 2,300] of CPU, as much as 6.1 calls on
    a kept connection (0.34 ms each)"."""
    line = f"{c.target}: a new connection costs {microseconds(c.per_connection)} of CPU"
    kept = c.kept_call.value
    if kept > 0:
        calls = c.per_connection.value / kept
        line += f", as much as {calls:.1f} calls on a kept connection ({kept:.2f} ms each)"
    churns = ", ".join(churn_name(n) for n in c.churns)
    return Finding(
        QUESTION,
        line + f" (churn {churns}).",
        effect=max(c.per_connection.value, 0.0) / kept if kept > 0 else 0.0,
        answer=True,
        caveat="" if c.per_connection.low is not None else "one repeat at two churns: no interval",
    )


def _handshake_finding(h: Handshake) -> Finding:
    """E.g. "aiohttp-h1-tls: a full TLS handshake costs 1,690 µs [1,500, 1,880] of CPU (its new connection
    over aiohttp-h1's); k6 never resumes a TLS session"."""
    return Finding(
        QUESTION,
        f"{h.tls.target}: a full TLS handshake costs {microseconds(h.cost)} of CPU (its new connection "
        f"over {h.cleartext.target}'s); k6 never resumes a TLS session.",
        answer=True,
    )
