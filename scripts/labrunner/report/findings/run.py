"""What the run as a whole says: the groups only a lower bound, latency not compared, and when no
target could be compared at all, what would answer on this host."""

from collections.abc import Sequence

from labrunner.model.scenario import UPLOAD
from labrunner.report.compare import Group
from labrunner.report.findings.finding import Evidence, Finding, closed_groups, open_groups
from labrunner.results.trust import LIMITED_BY_K6, verdict_of

QUESTION = "run"


def findings(evidence: Evidence) -> list[Finding]:
    closed = closed_groups(evidence.groups)
    # Over an emulated link the link, not the service, is meant to set the pace: not a caveat there.
    found = [_in_no_ratio(g) for g in closed if g.lower_bound and g.network == "loopback"]
    if closed and not open_groups(evidence.groups):
        found.append(
            Finding(
                QUESTION,
                "Latency is not compared: no target ran under an offered load (open model); "
                "latency at saturation says more about the CPU quota than the protocol.",
            )
        )
    return found + cannot_compare(evidence.groups)


def _in_no_ratio(g: Group) -> Finding:
    uploads = ", uploads" if g.direction == UPLOAD else ""
    where = f"{g.target} ({g.profile}, {g.count} records{uploads}"
    where += f", beside {g.partner})" if g.partner else ")"
    return Finding(QUESTION, f"{where}: throughput only a lower bound, {g.lower_bound}: in no ratio.")


def cannot_compare(groups: Sequence[Group]) -> list[Finding]:
    """When every closed-model group is only a lower bound: say so, and what would answer on this host."""
    closed = closed_groups(groups)
    if not closed or any(not g.lower_bound for g in closed):
        return []
    saturated = [g for g in closed if any(verdict_of(r).limited_by == LIMITED_BY_K6 for r in g.results)]
    remedy = (
        "give k6 CPUs of its own (--load-engine) or run a smaller profile (--profile quarter)"
        if saturated
        else "run a profile whose quota the service fills (--profile quarter locally), or a "
        "host or engine with CPUs to spare for k6"
    )
    return [
        Finding(
            QUESTION,
            f"No comparison between targets: every one of {len(closed)} closed-model groups is only a "
            f"lower bound of its service ({closed[0].lower_bound}), so this run measured its load "
            f"generator or host, not the servers; {remedy}.",
        )
    ]
