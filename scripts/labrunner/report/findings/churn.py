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
    """E.g. "aiohttp-h1-tls: a new connection costs 2,100 µs [1,900, 2,300] of CPU, 6.1 calls on a kept
    connection (0.34 ms each)"."""
    line = f"{c.target}: a new connection costs {microseconds(c.per_connection)} of CPU"
    kept = c.kept_call.value
    if kept > 0:
        line += f", {c.per_connection.value / kept:.1f} calls on a kept connection ({kept:.2f} ms each)"
    churns = ", ".join(churn_name(n) for n in c.churns)
    return Finding(
        QUESTION,
        line + f" (churn {churns}).",
        effect=max(c.per_connection.value, 0.0) / kept if kept > 0 else 0.0,
        answer=True,
        caveat="" if c.per_connection.low is not None else "one repeat at two churns: no interval",
    )


def _handshake_finding(h: Handshake) -> Finding:
    """E.g. "A full TLS handshake costs aiohttp (HTTP/1.1) 1,690 µs [1,500, 1,880] (aiohttp-h1-tls over
    aiohttp-h1); k6 never resumes a session"."""
    return Finding(
        QUESTION,
        f"A full TLS handshake costs {h.tls.service} ({h.tls.protocol}) {microseconds(h.cost)} of CPU "
        f"({h.tls.target}'s new connection over {h.cleartext.target}'s); k6 never resumes a TLS session.",
        answer=True,
    )
