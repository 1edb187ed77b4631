"""Connections: what churn (a new connection every N calls) and compression did to each target, the
fit of CPU per call against connections per call, and each TLS handshake's cost (report.connection_cost)."""

from collections.abc import Sequence

from labrunner.model.scenario import IDENTITY, churn_name
from labrunner.report.compare import Group
from labrunner.report.connection_cost import METHOD, connection_costs, handshakes, microseconds
from labrunner.report.document import Block, Heading, Paragraph, Table, table
from labrunner.report.findings.churn import US
from labrunner.report.findings.compression import compressed_pairs
from labrunner.report.findings.finding import closed_groups
from labrunner.report.handshakes import HandshakeCase
from labrunner.report.sections.section import Report, Section

TITLE = "Connections: churn and compression"


def applies(report: Report) -> bool:
    return bool(report.handshakes) or any(
        g.churn is not None or g.compression != IDENTITY for g in report.run.groups
    )


def blocks(report: Report) -> list[Block]:
    groups = closed_groups(report.run.groups)
    shown: list[Block] = [Heading(2, TITLE)]
    churned = [
        g
        for g in groups
        if g.streams == 1 and any(h.churn is not None for h in groups if h.target == g.target)
    ]
    if churned:
        shown += [Heading(3, "Churn"), _churn_table(churned), Paragraph(METHOD)]
        costs = connection_costs(groups)
        if costs:
            shown.append(
                table(
                    ["target", "a call, connection kept (ms)", "a new connection", "in calls kept"],
                    [
                        [
                            c.target,
                            f"{c.kept_call.value:.3f}",
                            microseconds(c.per_connection),
                            f"{c.per_connection.value / c.kept_call.value:.1f}"
                            if c.kept_call.value > 0
                            else "—",
                        ]
                        for c in costs
                    ],
                )
            )
        if found := handshakes(costs):
            shown.append(
                table(
                    ["TLS target", "cleartext twin", "a full TLS handshake"],
                    [[h.tls.target, h.cleartext.target, microseconds(h.cost)] for h in found],
                )
            )
    if report.handshakes:
        shown += [Heading(3, "Full against resumed TLS handshakes"), Paragraph(HANDSHAKE_METHOD)]
        shown.append(_handshake_table(report.handshakes))
    compressed = compressed_pairs(groups)
    if compressed:
        shown += [
            Heading(3, "Compression"),
            Paragraph(
                "Each target compressing its responses against itself sending them as they are: bytes a "
                "response as k6 read them from the socket (headers, framing and TLS included), the "
                "server's and k6's CPU per response, req/s; geometric means over the repeats."
            ),
            _compression_table([g for c in compressed for g in (c.baseline, c.candidate)]),
        ]
    return shown


HANDSHAKE_METHOD = (
    "The handshake benchmark (labrunner.report.handshakes, after the run on the idle host): each server "
    "whose handshakes are counted, one worker on its own CPU, takes rounds of full handshakes, of resumed "
    "ones (a Python client offering the session of an earlier connection) and of connections closed "
    "before any handshake; the worker's CPU per connection from its threads' schedstat, mean over the "
    "rounds with a 95% t interval, the ratio paired round by round. The server's own counter "
    "(protolab_tls_handshakes_total) must equal the plan, or the server is not reported."
)


def _handshake_table(cases: Sequence[HandshakeCase]) -> Table:
    return table(
        [
            "server",
            "TLS",
            "full (µs)",
            "resumed (µs)",
            "resumed / full",
            "no handshake (µs)",
            "counted",
            "others",
        ],
        [
            [
                c.service,
                c.tls_version,
                c.full_us.text(US),
                c.resumed_us.text(US),
                c.resumed_over_full.text(),
                c.no_handshake_us.text(US),
                f"{c.counted_full:,} full, {c.counted_resumed:,} resumed",
                f"{c.others_share:.0%}",
            ]
            for c in cases
        ],
    )


def _centre(group: Group, metric: str, scale: float = 1.0, digits: int = 0) -> str:
    summary = group.summary(metric)
    return "—" if summary is None else f"{summary.centre * scale:,.{digits}f}"


def _churn_table(groups: Sequence[Group]) -> Table:
    """Each target at each churn (a duet's groups: one row each, its partner named)."""
    ordered = sorted(groups, key=lambda g: (g.target, g.churn is not None, g.churn or 0, g.partner or ""))
    return table(
        ["target", "churn", "beside", "repeats", "req/s", "CPU per call (ms)", "connections dialed per call"],
        [
            [
                g.target,
                churn_name(g.churn),
                g.partner or "—",
                str(len(g.results)),
                _centre(g, "rps"),
                _centre(g, "cpu_per_1k", digits=3),
                _centre(g, "dialed", digits=3),
            ]
            for g in ordered
        ],
    )


def _compression_table(groups: Sequence[Group]) -> Table:
    return table(
        [
            "target",
            "network",
            "compression",
            "repeats",
            "req/s",
            "bytes / response",
            "server CPU / resp (ms)",
            "k6 CPU / resp (ms)",
        ],
        [
            [
                g.target,
                g.network,
                g.compression,
                str(len(g.results)),
                _centre(g, "rps"),
                _centre(g, "bytes"),
                _centre(g, "cpu_per_1k", digits=3),
                _centre(g, "k6_cpu_per_1k", digits=3),
            ]
            for g in {id(g): g for g in groups}.values()
        ],
    )


SECTION = Section(TITLE, applies, blocks)
