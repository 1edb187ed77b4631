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

from labrunner.model.questions import QUESTIONS
from labrunner.report.compare import THROUGHPUT, Comparison, Group, partners
from labrunner.report.stats import Ratio, ratio

LOOPBACK = "loopback"
CLOSED, OPEN = "closed", "open"
# Within a profile: the protocol questions of the comparison rules, and what both sides share.
PROTOCOL_KINDS = ("HTTP/2 vs HTTP/1.1", "HTTP/3 vs HTTP/2", "HTTP/3 vs HTTP/1.1", "gRPC vs REST")
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
    "shape",
    "streams",
    "churn",
    "compression",
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
                if not partners(candidate, baseline):  # a duet's group compares with its partner's only
                    continue
                if _protocol_pair(candidate, baseline) == kind:
                    ratios = {
                        m: r for m in COMPARED_HERE if (r := welch_ratio(candidate, baseline, m)) is not None
                    }
                    comparisons.append(Comparison(kind, candidate, baseline, ratios))
    return comparisons


def _protocol_pair(candidate: Group, baseline: Group) -> str | None:
    """The protocol question a pair answers, by the report's comparison rules (model.questions), or None."""
    return next((q.kind for q in QUESTIONS if q.kind in PROTOCOL_KINDS and q.asks(candidate, baseline)), None)


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
                rps=welch_ratio(g, base, "rps"),
                p50_added_ms=_added(g, base, "p50"),
                p99_added_ms=_added(g, base, "p99"),
                p99=welch_ratio(g, base, "p99"),
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


def welch_ratio(candidate: Group, baseline: Group, metric: str) -> Ratio | None:
    """candidate / baseline of a metric over their repeats, unpaired (stats.ratio); None without values."""
    c, b = candidate.values(metric), baseline.values(metric)
    return ratio(c, b) if c and b else None


def _added(here: Group, loopback: Group, metric: str) -> float | None:
    a, b = centre(here, metric), centre(loopback, metric)
    return None if a is None or b is None else a - b


def centre(g: Group, metric: str) -> float | None:
    s = g.summary(metric)
    return s.centre if s else None
