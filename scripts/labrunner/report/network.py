"""The report's network section: protocols within each network profile, and what a link costs.

Only for runs with more than one network profile. For the closed and the open load model apart:

- within a profile, the protocols against each other (the report's comparison rules, which
  hold the network fixed), with Welch intervals where there are repeats;
- across profiles, each target on an emulated link against the same group on loopback: the
  ratio of requests/s, the latency the link added (p50, p99) and bytes per response. Under the
  closed model a slower round trip lowers the offered load (each VU waits for its answer);
  under the open model the offered rate stays, so the link shows up as latency, as dropped
  iterations, or as an achieved rate below the offered one.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from labrunner.report.compare import THROUGHPUT, Comparison, Group
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.stats import CONFIDENCE, METHOD_LINE, Ratio, Summary, ratio

LOOPBACK = "loopback"
CLOSED, OPEN = "closed", "open"
# Within a profile: the protocol questions of the comparison rules, and what both sides share.
PROTOCOL_KINDS = ("HTTP/2 vs HTTP/1.1", "gRPC vs REST")
_SAME = (
    "network",
    "tls",
    "profile",
    "count",
    "load_model",
    "response_model",
    "direction",
    "instrumented",
    "kind",
)
COMPARED_HERE = ("rps", "p50", "p99", "bytes")


def load_kind(group: Group) -> str | None:
    """CLOSED (constant or ramping VUs), OPEN (constant arrival rate) or None (not compared here)."""
    if group.kind != THROUGHPUT or not group.results:
        return None
    executor = group.results[0].scenario.load_model.executor
    return OPEN if executor == "constant-arrival-rate" else CLOSED


def networks(groups: Sequence[Group]) -> list[str]:
    """The network profiles with a successful throughput group, in the order they first appear."""
    seen: list[str] = []
    for g in groups:
        if load_kind(g) is not None and g.network not in seen:
            seen.append(g.network)
    return seen


def within_profile(groups: Sequence[Group]) -> list[Comparison]:
    """Protocol against protocol inside each network profile, at equal profile, payload and load.

    The report's own comparisons leave out closed-model groups whose service did not use its
    quota (a lower bound of the service's throughput); over an emulated link that is the point
    (the link, not the service, sets the pace), so here they are compared and marked instead.
    """
    usable = [g for g in groups if load_kind(g) is not None]
    comparisons = []
    for kind in PROTOCOL_KINDS:
        for candidate in usable:
            for baseline in usable:
                if candidate is baseline or any(getattr(candidate, a) != getattr(baseline, a) for a in _SAME):
                    continue
                if _protocol_pair(candidate, baseline) == kind:
                    ratios = {
                        m: r for m in COMPARED_HERE if (r := _ratio(candidate, baseline, m)) is not None
                    }
                    comparisons.append(Comparison(kind, candidate, baseline, ratios))
    return comparisons


def _protocol_pair(candidate: Group, baseline: Group) -> str | None:
    """The protocol question a pair answers (as the report's comparison rules pair them), or None."""
    if (
        candidate.protocol == "http2"
        and baseline.protocol == "http1.1"
        and candidate.service == baseline.service
    ):
        return PROTOCOL_KINDS[0]
    if candidate.protocol == "grpc" and baseline.protocol != "grpc":
        return PROTOCOL_KINDS[1]
    return None


@dataclass(frozen=True)
class LinkCost:
    """One group on an emulated link against the same group on loopback."""

    group: Group
    loopback: Group
    rps: Ratio | None  # here / loopback, with its interval where both have repeats
    p50_added_ms: float | None  # geometric mean here - geometric mean on loopback
    p99_added_ms: float | None
    p99: Ratio | None

    @property
    def kind(self) -> str:
        return load_kind(self.group) or ""


def loopback_id(group: Group) -> str:
    """The id of the same group on loopback: group ids end in ".<network>" off loopback."""
    return group.id.removesuffix(f".{group.network}") if group.network != LOOPBACK else group.id


def link_costs(groups: Sequence[Group]) -> list[LinkCost]:
    """Every emulated-link group that has its loopback twin with results, in group order."""
    by_id = {g.id: g for g in groups if load_kind(g) is not None}
    costs = []
    for g in groups:
        if g.network == LOOPBACK or load_kind(g) is None:
            continue
        base = by_id.get(loopback_id(g))
        if base is None or base.network != LOOPBACK:
            continue
        costs.append(
            LinkCost(
                group=g,
                loopback=base,
                rps=_ratio(g, base, "rps"),
                p50_added_ms=_added(g, base, "p50"),
                p99_added_ms=_added(g, base, "p99"),
                p99=_ratio(g, base, "p99"),
            )
        )
    return costs


def offered_rate(group: Group) -> float | None:
    """An open model's arrival rate (iterations/s); None for a closed model."""
    if load_kind(group) != OPEN:
        return None
    rate = group.results[0].scenario.load_model.rate
    return float(rate) if rate else None


def dropped(group: Group) -> int:
    """Iterations k6 could not start on time, over every repeat (open model)."""
    return sum(r.metrics.dropped_iterations for r in group.results if r.metrics)


def achieved_share(group: Group) -> float | None:
    """Successful requests/s (geometric mean) over the offered rate (open model)."""
    rate, rps = offered_rate(group), group.summary("rps")
    return rps.centre / rate if rate and rps else None


def measured_rtt_ms(group: Group) -> float | None:
    """The median RTT verification measured before the group's repeats, in ms."""
    rtts = [rtt for r in group.results if (rtt := r.network.measured_rtt_s) is not None]
    return median(rtts) * 1000 if rtts else None


def relay_cpu_s(group: Group) -> float | None:
    """The median CPU seconds the userspace link emulator took over a measured window."""
    values = [v for r in group.results if (v := r.network.relay_cpu_s) is not None]
    return median(values) if values else None


def emulator(group: Group) -> str:
    names = sorted({r.network.emulator or "-" for r in group.results})
    return ", ".join(names) if group.network != LOOPBACK else "-"


def section(groups: Sequence[Group]) -> list[Block]:
    """The "Network profiles" section; [] unless the run has more than one profile."""
    profiles = networks(groups)
    if len(profiles) < 2:
        return []
    blocks: list[Block] = [
        Heading(2, "Network profiles"),
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
        blocks.append(Heading(3, f"{kind.capitalize()} model"))
        blocks.append(_overview(members, kind))
        kind_costs = [c for c in costs if c.kind == kind]
        if kind_costs:
            blocks += [Paragraph(_cost_caption(kind)), _costs_table(kind_costs, kind)]
            blocks += _findings(kind_costs)
        kind_comparisons = [c for c in comparisons if load_kind(c.candidate) == kind]
        if kind_comparisons:
            blocks += [
                Paragraph("Protocols within each network profile (candidate / baseline):"),
                _within_table(kind_comparisons),
            ]
    return blocks


def _overview(groups: Sequence[Group], kind: str) -> Any:
    headers = ["network", "target", "load", "repeats", "req/s (geometric mean)", f"req/s {CONFIDENCE:.0%} CI"]
    headers += ["p50 ms", "p99 ms", "bytes / resp", "RTT measured ms", "emulator", "relay CPU s"]
    if kind == OPEN:
        headers[6:6] = ["offered req/s", "achieved / offered", "dropped"]
    rows = []
    for g in sorted(groups, key=lambda g: (_network_order(groups, g.network), g.order)):
        rps = g.summary("rps")
        row = [
            f"`{g.network}`",
            g.target,
            g.load_model,
            str(len(g.results)),
            _fmt(rps.centre if rps else None, "{:.1f}"),
            _interval(rps, "{:.1f}"),
            _fmt(_centre(g, "p50"), "{:.2f}"),
            _fmt(_centre(g, "p99"), "{:.2f}"),
            _fmt(_centre(g, "bytes"), "{:.0f}"),
            _fmt(measured_rtt_ms(g), "{:.2f}"),
            emulator(g),
            _fmt(relay_cpu_s(g), "{:.2f}"),
        ]
        if kind == OPEN:
            row[6:6] = [_fmt(offered_rate(g), "{:.0f}"), _fmt(achieved_share(g), "{:.0%}"), str(dropped(g))]
        rows.append(row)
    return table(headers, rows, tuple(i >= 3 and headers[i] != "emulator" for i in range(len(headers))))


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
            f"{_fmt(_centre(c.loopback, 'rps'), '{:.1f}')} → {_fmt(_centre(c.group, 'rps'), '{:.1f}')}",
            _ratio_cell(c.rps),
            _fmt(c.p50_added_ms, "{:+.2f}"),
            _fmt(c.p99_added_ms, "{:+.2f}"),
            _ratio_cell(c.p99),
            f"{_fmt(_centre(c.loopback, 'bytes'), '{:.0f}')} → {_fmt(_centre(c.group, 'bytes'), '{:.0f}')}",
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
                c.kind,
                c.candidate.target,
                c.baseline.target,
                *(_ratio_cell(c.ratios.get(m)) for m in COMPARED_HERE),
                _bound_note(c),
            ]
        )
    return table(headers, rows, (False, False, False, False, True, True, True, True, False))


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


def _ratio(candidate: Group, baseline: Group, metric: str) -> Ratio | None:
    c, b = candidate.values(metric), baseline.values(metric)
    return ratio(c, b) if c and b else None


def _added(here: Group, loopback: Group, metric: str) -> float | None:
    a, b = _centre(here, metric), _centre(loopback, metric)
    return None if a is None or b is None else a - b


def _centre(g: Group, metric: str) -> float | None:
    s = g.summary(metric)
    return s.centre if s else None


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
