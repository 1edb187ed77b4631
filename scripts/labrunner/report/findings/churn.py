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
from labrunner.report.findings.finding import Evidence, Finding, held_by
from labrunner.report.findings.pairs import CHURN
from labrunner.report.handshakes import HandshakeCase

# A handshake benchmark beside more than this share of other work on the host is said to be.
OTHERS_QUIET = 0.05
US = "{:,.0f}"  # how µs read
QUESTION = CHURN  # its answers stand before the pairs' lines under the one heading


def findings(evidence: Evidence) -> list[Finding]:
    """One answer per set of conditions the churns ran under: each target's cost of a new connection,
    then each TLS target's handshake over its cleartext twin; [] for a run with no churn."""
    costs = connection_costs(evidence.groups)
    found = [_target_finding(c) for c in costs]
    found += [_handshake_finding(h) for h in handshakes(costs)]
    return found + [_resumption_finding(c) for c in evidence.handshakes]


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
        held_fixed=held_by(c.group),
    )


def _resumption_finding(c: HandshakeCase) -> Finding:
    """E.g. "rest_aiohttp, handshake benchmark: a resumed TLS 1.3 handshake costs 558 µs [512, 604] of
    the server's CPU, a full one 600 µs [555, 644]: 0.93x [0.86, 1.00]"."""
    return Finding(
        QUESTION,
        f"{c.service}, handshake benchmark: a resumed {c.tls_version} handshake costs "
        f"{c.resumed_us.text(US, ' µs')} of the server's CPU, a full one {c.full_us.text(US, ' µs')}: "
        f"{c.resumed_over_full.text(unit='x')} "
        f"(a Python client resuming, one worker, {c.rounds} rounds of {c.handshakes}).",
        answer=True,
        caveat=f"others used {c.others_share:.0%} of the host" if c.others_share > OTHERS_QUIET else "",
    )


def _handshake_finding(h: Handshake) -> Finding:
    """E.g. "aiohttp-h1-tls: a full TLS handshake costs 1,690 µs [1,500, 1,880] of CPU (its new connection
    over aiohttp-h1's); k6 never resumes a TLS session"."""
    return Finding(
        QUESTION,
        f"{h.tls.target}: a full TLS handshake costs {microseconds(h.cost)} of CPU (its new connection "
        f"over {h.cleartext.target}'s); k6 never resumes a TLS session.",
        answer=True,
        held_fixed=held_by(h.tls.group),
    )
