"""The compression question's answers: per target and network, what gzip saves on the wire (bytes per
response, as k6 read them from the socket) and what it costs the server and k6 in CPU per response,
and what that does to req/s; each target compressing against itself sending its responses as they are."""

from collections.abc import Sequence

from labrunner.model.questions import pairs
from labrunner.report.compare import Comparison, Group, compare_groups
from labrunner.report.findings.finding import Evidence, Finding, closed_groups, held_fixed
from labrunner.report.findings.pairs import COMPRESSION
from labrunner.report.network import welch_ratio
from labrunner.report.stats import Ratio

QUESTION = COMPRESSION
KIND = "compressed vs identity"  # model.questions' rule
LOOPBACK = "loopback"
_COMPARED = ("rps", "cpu_per_1k")


def findings(evidence: Evidence) -> list[Finding]:
    """One answer per compressed target and network; [] for a run that compressed nothing."""
    return [_finding(c) for c in compressed_pairs(evidence.groups)]


def compressed_pairs(groups: Sequence[Group]) -> list[Comparison]:
    """Each compressed closed-model group against its identity self: on loopback as the report compares
    pairs (a duet's within its blocks; a group not service-bound in none), over an emulated link every
    pair with Welch's ratios, since there the link, not the service, is meant to set the pace."""
    closed = closed_groups(groups)
    found = [c for c in compare_groups([g for g in closed if g.network == LOOPBACK]) if c.kind == KIND]
    for question, candidate, baseline in pairs([g for g in closed if g.network != LOOPBACK]):
        if question.kind == KIND:
            ratios = {m: r for m in _COMPARED if (r := welch_ratio(candidate, baseline, m)) is not None}
            found.append(Comparison(KIND, candidate, baseline, ratios))
    return found


def _finding(c: Comparison) -> Finding:
    """E.g. "grpc, narrow: gzip 3,884 bytes a response against 7,625 (0.51x); server CPU/response
    1.31x, k6's 1.05x; req/s 1.86x [1.70, 2.03]"."""
    gzip, identity = c.candidate, c.baseline
    sent, plain = _centre(gzip, "bytes"), _centre(identity, "bytes")
    line = f"{gzip.target}, {gzip.network}: {gzip.compression}"
    if sent is not None and plain:
        line += f" {sent:,.0f} bytes a response against {plain:,.0f} ({sent / plain:.2f}x)"
    line += f"; server CPU/response {_ratio(c.ratios.get('cpu_per_1k'))}"
    k6_cpu, k6_plain = _centre(gzip, "k6_cpu_per_1k"), _centre(identity, "k6_cpu_per_1k")
    if k6_cpu is not None and k6_plain:
        line += f", k6's {k6_cpu / k6_plain:.2f}x"
    rps = c.ratios.get("rps")
    line += f"; req/s {_ratio(rps)}"
    caveat = ""
    if gzip.network == LOOPBACK:  # over a link, not service-bound is the point
        caveat = "; ".join(
            f"{g.target} ({g.compression}): {why}" for g in (gzip, identity) if (why := g.lower_bound)
        )
    return Finding(
        QUESTION,
        line + ".",
        effect=abs(1 - sent / plain) if sent is not None and plain else 0.0,
        answer=True,
        caveat=caveat,
        held_fixed=held_fixed(c),
    )


def _centre(group: Group, metric: str) -> float | None:
    summary = group.summary(metric)
    return None if summary is None else summary.centre


def _ratio(r: Ratio | None) -> str:
    """'1.31x [1.20, 1.43]', or '—' without a ratio."""
    if r is None:
        return "—"
    interval = f" [{r.low:.2f}, {r.high:.2f}]" if r.low is not None and r.high is not None else ""
    return f"{r.estimate:.2f}x{interval}"
