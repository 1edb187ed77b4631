"""The network findings: what each link costs each protocol, and where the protocols' order flips."""

import math
from collections.abc import Sequence

from labrunner.model.scenario import IDENTITY
from labrunner.report.compare import Comparison, Group
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.network import (
    CLOSED,
    LOOPBACK,
    OPEN,
    LinkCost,
    achieved_share,
    dropped,
    link_costs,
    load_kind,
    networks,
    offered_rate,
    within_profile,
)
from labrunner.report.stats import Ratio, ratio

QUESTION = "network"
# What leads under each load model: more req/s at equal VUs, a lower p50 at an equal offered rate.
LEADING_METRIC = {CLOSED: "rps", OPEN: "p50"}


def findings(evidence: Evidence) -> list[Finding]:
    """[] unless the run has more than one network profile."""
    groups = evidence.groups
    if len(networks(groups)) < 2:
        return []
    return _cost_findings(link_costs(groups)) + _order_findings(within_profile(groups))


def _cost_findings(costs: Sequence[LinkCost]) -> list[Finding]:
    """One finding per link and load model: each target against itself on loopback."""
    by_link: dict[tuple[str, str, str, int, str, str, str, str], list[LinkCost]] = {}
    for c in costs:
        g = c.group
        key = (g.network, c.kind, g.profile, g.count, g.response_model, g.direction, g.shape, g.compression)
        by_link.setdefault(key, []).append(c)
    out = []
    for (network, kind, *_), members in by_link.items():
        if kind == CLOSED:
            parts = [
                f"{c.group.target} {_ratio_text(c.rps, 'req/s')}, p50 {_added(c.p50_added_ms)}"
                for c in members
            ]
            effect = _effect([c.rps for c in members])
            head = f"`{network}` against loopback, closed model ({_load(members[0].group)})"
        else:
            parts = [_open_part(c) for c in members]
            effect = _effect([_p50_ratio(c) for c in members])
            head = f"`{network}` against loopback, open model ({_load(members[0].group)})"
        caveats = _suspects([g for c in members for g in (c.group, c.loopback)])
        if any(c.rps is not None and c.rps.significant is None for c in members):
            caveats.append("one repeat on a side: no interval")
        out.append(
            Finding(
                QUESTION,
                f"{head}: " + "; ".join(parts) + f"; {_held(members[0].group)}",
                effect,
                "; ".join(caveats),
            )
        )
    return out


def _open_part(c: LinkCost) -> str:
    share = achieved_share(c.group)
    lost = dropped(c.group)
    text = f"{c.group.target} p50 {_added(c.p50_added_ms)}"
    if share is not None:
        text += f", {share:.0%} of the offered rate"
    return text + (f", {lost} iterations dropped" if lost else "")


def _order_findings(comparisons: Sequence[Comparison]) -> list[Finding]:
    """Pairs whose leader on a link is not their leader on loopback; one "no flip" finding per load
    model where none flips."""
    loopback = {_pair_key(c): c for c in comparisons if c.candidate.network == LOOPBACK}
    out = []
    compared: dict[str, int] = {}
    flipped: set[str] = set()
    for c in comparisons:
        kind = load_kind(c.candidate)
        if c.candidate.network == LOOPBACK or kind is None:
            continue
        metric = LEADING_METRIC[kind]
        base = loopback.get(_pair_key(c))
        here, there = c.ratios.get(metric), base.ratios.get(metric) if base else None
        if base is None or here is None or there is None:
            continue
        compared[kind] = compared.get(kind, 0) + 1
        leader_here, lead_here = _lead(c, here, metric)
        leader_there, lead_there = _lead(base, there, metric)
        if leader_here == leader_there:
            continue
        other_here = c.baseline.target if leader_here == c.candidate.target else c.candidate.target
        what = "req/s" if metric == "rps" else "p50 (lower latency)"
        sentence = (
            f"over `{c.candidate.network}` ({kind} model), {leader_here} leads {other_here} "
            f"{_lead_text(lead_here)} in {what}; on loopback {leader_there} leads {_lead_text(lead_there)}; "
            + _held(c.candidate)
        )
        bounds = [
            f"{g.target} on loopback is a lower bound"
            for g in (base.candidate, base.baseline)
            if g.lower_bound
        ]
        effect = abs(math.log(lead_here.estimate)) if lead_here.significant else 0.0
        out.append(Finding(QUESTION, sentence, effect, "; ".join(bounds)))
        flipped.add(kind)
    for kind, pairs in compared.items():
        if kind not in flipped:
            what = "req/s" if kind == CLOSED else "p50"
            out.append(
                Finding(
                    QUESTION,
                    f"{kind} model: over every link the protocols lead in {what} in the same order as on "
                    f"loopback ({pairs} protocol pairs compared)",
                )
            )
    return out


def _pair_key(c: Comparison) -> tuple[object, ...]:
    g = c.candidate
    return (
        c.kind,
        g.target,
        c.baseline.target,
        g.load_model,
        g.profile,
        g.count,
        g.response_model,
        g.direction,
        g.tls,
        g.shape,
        g.streams,
        g.churn,
        g.compression,
    )


def _lead(c: Comparison, r: Ratio, metric: str) -> tuple[str, Ratio]:
    """Who leads the pair and by how much (a ratio >= 1 in the leader's favour, interval inverted)."""
    candidate_leads = r.estimate >= 1 if metric == "rps" else r.estimate <= 1
    in_candidate_terms = r if metric == "rps" else _inverse(r)
    if candidate_leads:
        return c.candidate.target, in_candidate_terms
    return c.baseline.target, _inverse(in_candidate_terms)


def _inverse(r: Ratio) -> Ratio:
    low = 1 / r.high if r.high is not None else None
    high = 1 / r.low if r.low is not None else None
    return Ratio(1 / r.estimate, low, high, r.p_value, r.significant, r.note, r.equivalent)


def _lead_text(r: Ratio) -> str:
    if r.low is None or r.high is None:
        return f"{_times(r.estimate)}x ({r.note})"
    text = f"{_times(r.estimate)}x [{_times(r.low)}, {_times(r.high)}]"
    if r.significant:
        return text
    return f"{text} (equivalent within ±10%)" if r.equivalent else f"{text} (inconclusive)"


def _ratio_text(r: Ratio | None, unit: str) -> str:
    if r is None:
        return f"{unit} -"
    if r.low is None or r.high is None:
        return f"{_times(r.estimate)}x {unit}"
    return f"{_times(r.estimate)}x {unit} [{_times(r.low)}, {_times(r.high)}]"


def _times(value: float) -> str:
    """A ratio in two decimals, or two significant figures below 0.1 (0.086, not 0.09)."""
    return f"{value:.2f}" if value >= 0.095 else f"{value:.2g}"


def _p50_ratio(c: LinkCost) -> Ratio | None:
    here, there = c.group.values("p50"), c.loopback.values("p50")
    return ratio(here, there) if here and there else None


def _effect(ratios: Sequence[Ratio | None]) -> float:
    return max((abs(math.log(r.estimate)) for r in ratios if r is not None and r.significant), default=0.0)


def _held(g: Group) -> str:
    """What a network finding holds fixed besides the load model."""
    held = f"{g.profile} profile, {g.count} records, {g.response_model or 'build'}"
    return held if g.compression == IDENTITY else f"{held}, {g.compression}"


def _added(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:+.1f} ms"


def _load(g: Group) -> str:
    rate = offered_rate(g)
    return f"{rate:g}/s offered" if rate is not None else f"{g.results[0].scenario.load_model.vus} VUs"


def _suspects(groups: Sequence[Group]) -> list[str]:
    seen = dict.fromkeys(g.id for g in groups if any(r.suspect for r in g.results))
    return [f"{group_id} has suspect repeats" for group_id in seen]
