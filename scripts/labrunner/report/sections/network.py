"""Network profiles: the protocols within each profile, and what each link costs each target, for the
closed and the open load model apart."""

from collections.abc import Sequence
from typing import Any

from labrunner.report.compare import Comparison, Group
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.network import (
    CLOSED,
    COMPARED_HERE,
    LOOPBACK,
    OPEN,
    LinkCost,
    achieved_share,
    centre,
    dropped,
    emulator,
    link_costs,
    load_kind,
    measured_rtt_ms,
    networks,
    offered_rate,
    relay_cpu_s,
    within_profile,
)
from labrunner.report.sections.section import Report, Section
from labrunner.report.stats import CONFIDENCE, METHOD_LINE, Ratio, Summary

TITLE = "Network profiles"


def applies(report: Report) -> bool:
    return len(networks(report.run.groups)) >= 2


def blocks(report: Report) -> list[Block]:
    return section(report.run.groups)


def section(groups: Sequence[Group]) -> list[Block]:
    """The protocols within each profile, then what each link costs, per load model."""
    profiles = networks(groups)
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            f"The run covers the network profiles {', '.join(f'`{n}`' for n in profiles)}. Within a "
            "profile the protocols are compared at equal VUs or arrival rate; across profiles each target "
            "is compared with itself on loopback. Under the closed model each VU waits for its answer, so "
            "a longer round trip lowers the load offered; under the open model the arrival rate stays, so "
            "a link shows up as latency, as dropped iterations or as an achieved rate below the offered "
            f"one. Ratios are geometric-mean ratios with Welch {CONFIDENCE:.0%} intervals where both sides "
            "have repeats; added latency is the difference of the geometric means over repeats, in ms. "
            + METHOD_LINE
        ),
    ]
    costs = link_costs(groups)
    comparisons = within_profile(groups)
    for kind in (CLOSED, OPEN):
        members = [g for g in groups if load_kind(g) == kind]
        if not members:
            continue
        shown.append(Heading(3, f"{kind.capitalize()} model"))
        shown.append(_overview(members, kind))
        kind_costs = [c for c in costs if c.kind == kind]
        if kind_costs:
            shown += [Paragraph(_cost_caption(kind)), _costs_table(kind_costs, kind)]
            shown += _findings(kind_costs)
        kind_comparisons = [c for c in comparisons if load_kind(c.candidate) == kind]
        if kind_comparisons:
            shown += [
                Paragraph("Protocols within each network profile (candidate / baseline):"),
                _within_table(kind_comparisons),
            ]
    return shown


def _overview(groups: Sequence[Group], kind: str) -> Any:
    headers = ["network", "profile", "target", "load", "repeats", "req/s (geometric mean)"]
    headers += [
        f"req/s {CONFIDENCE:.0%} CI",
        "p50 ms",
        "p99 ms",
        "bytes / resp",
        "RTT measured ms",
        "emulator",
    ]
    headers += ["relay CPU s"]
    if kind == OPEN:
        headers[7:7] = ["offered req/s", "achieved / offered", "dropped"]
    rows = []
    for g in sorted(groups, key=lambda g: (_network_order(groups, g.network), g.order)):
        rps = g.summary("rps")
        row = [
            f"`{g.network}`",
            g.profile,
            g.target,
            g.load_model,
            str(len(g.results)),
            _fmt(rps.centre if rps else None, "{:.1f}"),
            _interval(rps, "{:.1f}"),
            _fmt(centre(g, "p50"), "{:.2f}"),
            _fmt(centre(g, "p99"), "{:.2f}"),
            _fmt(centre(g, "bytes"), "{:.0f}"),
            _fmt(measured_rtt_ms(g), "{:.2f}"),
            emulator(g),
            _fmt(relay_cpu_s(g), "{:.2f}"),
        ]
        if kind == OPEN:
            row[7:7] = [_fmt(offered_rate(g), "{:.0f}"), _fmt(achieved_share(g), "{:.0%}"), str(dropped(g))]
        rows.append(row)
    return table(headers, rows, tuple(i >= 4 and headers[i] != "emulator" for i in range(len(headers))))


def _cost_caption(kind: str) -> str:
    if kind == CLOSED:
        return (
            "What each link costs against loopback at equal VUs: req/s here / on loopback, the latency "
            "it adds, and bytes per response on both (bytes show what a rate-limited link must carry)."
        )
    return (
        "What each link costs against loopback at the same offered rate: the achieved rate, the dropped "
        "iterations and the latency the link adds."
    )


def _costs_table(costs: Sequence[LinkCost], kind: str) -> Any:
    headers = ["network", "target", "req/s loopback → here", "req/s ratio", "p50 added ms"]
    headers += ["p99 added ms", "p99 ratio", "bytes / resp loopback → here"]
    if kind == OPEN:
        headers[2:2] = ["offered req/s", "dropped loopback → here"]
    rows = []
    for c in costs:
        row = [
            f"`{c.group.network}`",
            c.group.target,
            f"{_fmt(centre(c.loopback, 'rps'), '{:.1f}')} → {_fmt(centre(c.group, 'rps'), '{:.1f}')}",
            _ratio_cell(c.rps),
            _fmt(c.p50_added_ms, "{:+.2f}"),
            _fmt(c.p99_added_ms, "{:+.2f}"),
            _ratio_cell(c.p99),
            f"{_fmt(centre(c.loopback, 'bytes'), '{:.0f}')} → {_fmt(centre(c.group, 'bytes'), '{:.0f}')}",
        ]
        if kind == OPEN:
            row[2:2] = [_fmt(offered_rate(c.group), "{:.0f}"), f"{dropped(c.loopback)} → {dropped(c.group)}"]
        rows.append(row)
    return table(headers, rows, tuple(i >= 2 for i in range(len(headers))))


def _findings(costs: Sequence[LinkCost]) -> list[Block]:
    """Per network: what the link cost each protocol (e.g. "what 50 ms costs HTTP/1.1, HTTP/2, gRPC")."""
    items = []
    for network in dict.fromkeys(c.group.network for c in costs):
        parts = []
        for c in (c for c in costs if c.group.network == network):
            rps = f"{c.rps.estimate:.2f}x req/s" if c.rps else "req/s -"
            p50 = f"{c.p50_added_ms:+.1f} ms p50" if c.p50_added_ms is not None else "p50 -"
            parts.append(f"{c.group.target} ({_protocol(c.group)}) {rps}, {p50}")
        items.append(f"`{network}` against loopback: " + "; ".join(parts))
    return [Bullets(tuple(items))] if items else []


def _within_table(comparisons: Sequence[Comparison]) -> Any:
    headers = (
        "network",
        "profile",
        "comparison",
        "candidate",
        "baseline",
        "req/s",
        "p50",
        "p99",
        "bytes / resp",
        "note",
    )
    rows = []
    for c in comparisons:
        rows.append(
            [
                f"`{c.candidate.network}`",
                c.candidate.profile,
                c.kind,
                c.candidate.target,
                c.baseline.target,
                *(_ratio_cell(c.ratios.get(m)) for m in COMPARED_HERE),
                _bound_note(c),
            ]
        )
    return table(headers, rows, (False, False, False, False, False, True, True, True, True, False))


def _bound_note(c: Comparison) -> str:
    """Which side's throughput was not set by its service's CPU (closed model): the link's or k6's."""
    bound = [g.target for g in (c.candidate, c.baseline) if g.lower_bound]
    if not bound:
        return ""
    where = "the link" if c.candidate.network != LOOPBACK else "not the service"
    return f"{', '.join(bound)}: paced by {where} (service below half its quota, or k6 saturated)"


def _protocol(g: Group) -> str:
    name = {"http1.1": "HTTP/1.1", "http2": "HTTP/2", "grpc": "gRPC"}.get(g.protocol, g.protocol)
    return f"{name}{' TLS' if g.tls else ''}"


def _network_order(groups: Sequence[Group], network: str) -> int:
    order = networks(groups)
    return order.index(network) if network in order else len(order)


def _ratio_cell(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if r.significant is None:
        return f"{r.estimate:.2f}x ({r.note})"
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    if r.significant:
        return f"**{r.estimate:.2f}x** {interval} significant"
    return f"{r.estimate:.2f}x {interval} not significant"


def _interval(s: Summary | None, spec: str) -> str:
    if s is None:
        return "-"
    if s.low is None or s.high is None:
        return s.note
    return f"[{spec.format(s.low)}, {spec.format(s.high)}]"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


SECTION = Section(TITLE, applies, blocks)
