"""Findings: one sentence per answered question, with its ratio, 95% interval and what was held fixed.

Throughput and CPU per request come from saturating (closed-model) groups, latency from groups
under an equal offered load (open model) that every compared target carried. A ratio whose
interval includes 1 is "no difference detectable"; lower bounds and suspect groups are named.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labrunner.report.compare import THROUGHPUT, Comparison, Group, compare_groups, is_streaming
from labrunner.report.stats import CONFIDENCE, Ratio
from labrunner.results.trust import unexplained_spread

# The questions a run can answer, in the order findings are printed, and the preset that asks each.
QUESTIONS = {
    "HTTP/2 vs HTTP/1.1": "default",
    "gRPC vs REST": "default",
    "server vs server": "implementations",
    "gRPC streaming vs unary": "default",
    "response model": "full",
    "metrics on vs off": "metrics-overhead",
    "network": "network",
    "payload": "payload",
    "run": "",
}
# Which compare.py rule answers which question.
_RULE_QUESTION = {
    "HTTP/2 vs HTTP/1.1": "HTTP/2 vs HTTP/1.1",
    "gRPC vs REST": "gRPC vs REST",
    "REST server vs REST server": "server vs server",
    "gRPC server vs gRPC server": "server vs server",
    "gRPC streaming vs unary": "gRPC streaming vs unary",
    "build vs prebuilt": "response model",
    "metrics on vs off": "metrics on vs off",
}
CLOSED_EXECUTORS = ("constant-vus", "ramping-vus")
OPEN_EXECUTORS = ("constant-arrival-rate",)
# An open-model group carried its offered rate when it served at least this share of it.
CARRIED_SHARE = 0.95


@dataclass(frozen=True)
class Finding:
    """One answer. effect: how large the difference is (|ln ratio|), 0 when none is detectable; it ranks
    findings within their question. caveat: a lower bound, a suspect group or a missing comparison."""

    question: str
    sentence: str
    effect: float = 0.0
    caveat: str = ""


def by_question(findings: Sequence[Finding]) -> list[tuple[str, list[str]]]:
    """(question, its sentences with their caveats) in ranked order."""
    questions: dict[str, list[str]] = {}
    for finding in ranked(findings):
        caveat = f" ({finding.caveat})" if finding.caveat else ""
        questions.setdefault(finding.question, []).append(f"{finding.sentence}{caveat}")
    return list(questions.items())


def markdown_section(findings: Sequence[Finding]) -> list[str]:
    """summary.md's Findings section: the heading, the method in one line, the findings."""
    return ["## Findings", "", CONFIDENCE_LINE, "", *(markdown(findings) or [NONE_YET]), ""]


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Grouped by question in QUESTIONS order, largest effect first within a question."""
    order = {q: i for i, q in enumerate(QUESTIONS)}
    return sorted(findings, key=lambda f: (order.get(f.question, len(order)), -f.effect))


def markdown(findings: Sequence[Finding]) -> list[str]:
    """The findings as markdown lines: a bold question, then its sentences."""
    lines: list[str] = []
    for question, sentences in by_question(findings):
        lines.append(f"- **{question}**")
        lines += [f"  - {sentence}" for sentence in sentences]
    return lines


def plain(findings: Sequence[Finding]) -> list[str]:
    """The findings for a terminal: the question, then its sentences indented."""
    return [line.replace("**", "").replace("- ", "", 1) for line in markdown(findings)]


def comparisons_findings(groups: Sequence[Group]) -> list[Finding]:
    """Findings from every comparison the groups hold, plus what could not be compared and why."""
    throughput = [g for g in groups if g.kind == THROUGHPUT and g.results]
    closed = [g for g in throughput if executor(g) in CLOSED_EXECUTORS]
    open_groups = [g for g in throughput if executor(g) in OPEN_EXECUTORS and g.network == "loopback"]
    latency = {_pair_key(c): c for c in compare_groups(open_groups) if c.kind in _RULE_QUESTION}
    found = []
    for comparison in compare_groups([g for g in closed if g.network == "loopback"]):
        question = _RULE_QUESTION.get(comparison.kind)
        if question is not None:
            found.append(_finding(question, comparison, latency.get(_pair_key(comparison))))
    found += _not_compared(closed, open_groups)
    return found


def cannot_compare(groups: Sequence[Group]) -> list[Finding]:
    """When every closed-model group is only a lower bound: say so, and what would answer on this host."""
    closed = [g for g in groups if g.kind == THROUGHPUT and g.results and executor(g) in CLOSED_EXECUTORS]
    if not closed or any(not g.lower_bound for g in closed):
        return []
    saturated = [g for g in closed if "k6 used" in (g.lower_bound or "")]
    remedy = (
        "give k6 CPUs of its own (--load-engine) or run a smaller profile (--profile quarter)"
        if saturated
        else "run a profile whose quota the service fills (--profile quarter locally), or a "
        "host or engine with CPUs to spare for k6"
    )
    return [
        Finding(
            "run",
            f"No comparison between targets: every one of {len(closed)} closed-model groups is only a "
            f"lower bound of its service ({closed[0].lower_bound}), so this run measured its load "
            f"generator or host, not the servers; {remedy}.",
        )
    ]


def unasked(found: Sequence[Finding], preset: str | None) -> list[Finding]:
    """One line naming the presets that answer the questions this run did not ask."""
    asked = {f.question for f in found}
    missing = [f"{q} (--preset {p})" for q, p in QUESTIONS.items() if p and q not in asked and p != preset]
    if not missing:
        return []
    return [Finding("run", "Not asked in this run: " + "; ".join(missing) + ".")]


def executor(group: Group) -> str:
    """The k6 executor of a group's load model."""
    return str(group.results[0]["scenario"]["load_model"]["executor"]) if group.results else ""


# An interval wider than this factor (high / low) says nothing a reader could use: two repeats of a
# tail percentile give [0.03, 66.96].
TOO_WIDE = 10.0


def describe_ratio(r: Ratio | None, what: str, digits: int = 2) -> str:
    """'1.21x [0.96, 1.53] the req/s', with 'no difference detectable' when the interval holds 1, and
    'too uncertain to tell' when it also spans more than a factor of TOO_WIDE."""
    if r is None:
        return f"no {what} figure"
    value = f"{r.estimate:.{digits}f}x"
    if r.low is None or r.high is None:
        return f"{value} the {what} ({r.note or 'no interval'})"
    interval = f"[{r.low:.{digits}f}, {r.high:.{digits}f}]"
    if not r.significant and r.high > TOO_WIDE * r.low:
        return f"{value} the {what}, too uncertain to tell (95% interval {interval}: more repeats needed)"
    verdict = "" if r.significant else ", no difference detectable"
    return f"{value} {interval} the {what}{verdict}"


def _finding(question: str, closed: Comparison, at_equal_load: Comparison | None) -> Finding:
    c, b = closed.candidate, closed.baseline
    rps, cpu = closed.ratios.get("rps"), closed.ratios.get("cpu_per_1k")
    candidate, baseline = _names(c, b)
    sentence = f"{candidate} served {describe_ratio(rps, f'req/s of {baseline}')}"
    sentence += f" at {describe_ratio(cpu, 'CPU per request')}"
    if at_equal_load is not None:
        rate = _offered_rate(at_equal_load.candidate)
        p50, p99 = at_equal_load.ratios.get("p50"), at_equal_load.ratios.get("p99")
        sentence += f"; at an equal {rate} req/s offered, {describe_ratio(p50, 'p50')}"
        sentence += f" and {describe_ratio(p99, 'p99')}"
    sentence += f"; held fixed: {_held_fixed(closed)}."
    effect = abs(math.log(rps.estimate)) if rps is not None and rps.significant else 0.0
    return Finding(question, sentence, effect, _caveat(c, b, at_equal_load))


def _names(candidate: Group, baseline: Group) -> tuple[str, str]:
    """The two sides by target, and by what differs when the target is the same on both (a response
    model, a profile, a network): 'aiohttp-h1 (build)' against 'aiohttp-h1 (prebuilt)'."""
    if candidate.target != baseline.target:
        return candidate.target, baseline.target
    for side in ("response_model", "profile", "network"):
        ours, theirs = getattr(candidate, side), getattr(baseline, side)
        if ours != theirs:
            return f"{candidate.target} ({ours})", f"{baseline.target} ({theirs})"
    return candidate.target, baseline.target


def _held_fixed(comparison: Comparison) -> str:
    g = comparison.candidate
    parts = [f"{g.profile} profile ({g.cpus:g} CPU)", f"{g.count} records"]
    if g.response_model and g.response_model == comparison.baseline.response_model:
        parts.append(g.response_model)
    parts.append(f"{g.load_model} model")
    if g.tls == comparison.baseline.tls:
        parts.append("TLS" if g.tls else "no TLS")
    if g.network != "loopback":
        parts.append(g.network)
    return ", ".join(parts)


def _caveat(candidate: Group, baseline: Group, at_equal_load: Comparison | None) -> str:
    notes = [_suspect(g) for g in (candidate, baseline)]
    notes += [_spread(g) for g in (candidate, baseline)]
    if at_equal_load is not None:
        notes += [_not_carried(g) for g in (at_equal_load.candidate, at_equal_load.baseline)]
    return "; ".join(n for n in notes if n)


def _suspect(group: Group) -> str:
    flagged = [r for r in group.results if r.get("suspect")]
    if not flagged:
        return ""
    return (
        f"{group.target}: {len(flagged)} of {len(group.results)} repeats suspect ({flagged[0]['suspect'][0]})"
    )


def _spread(group: Group) -> str:
    spread = unexplained_spread(group.results)
    return "" if spread is None else f"{group.target}: {spread.reason}"


def _not_carried(group: Group) -> str:
    rate = _offered_rate(group)
    served = group.values("rps")
    if rate is None or not served or min(served) >= CARRIED_SHARE * rate:
        return ""
    return f"{group.target} did not carry {rate} req/s (served {min(served):.0f}): its latency is a queue's"


def _offered_rate(group: Group) -> int | None:
    rate = group.results[0]["scenario"]["load_model"].get("rate") if group.results else None
    return int(rate) if rate else None


def _pair_key(c: Comparison) -> tuple[str, str, str, int, str, str]:
    return (
        c.kind,
        c.candidate.target,
        c.baseline.target,
        c.candidate.count,
        c.candidate.profile,
        c.candidate.response_model,
    )


def _not_compared(closed: Sequence[Group], open_groups: Sequence[Group]) -> list[Finding]:
    found = []
    for g in closed:
        if g.lower_bound:
            found.append(
                Finding(
                    "run",
                    f"{g.target} ({g.profile}, {g.count} records): throughput only a lower bound, "
                    f"{g.lower_bound}: in no ratio.",
                )
            )
    streams = [g for g in closed if is_streaming(g)]
    if streams and not any(not is_streaming(g) and g.protocol == "grpc" for g in closed):
        found.append(
            Finding(
                "gRPC streaming vs unary",
                "Streaming was measured without unary gRPC on the same records: it is compared with "
                "nothing (a stream of N messages is not one response of N records).",
            )
        )
    if closed and not open_groups:
        found.append(
            Finding(
                "run",
                "Latency is not compared: no target ran under an equal offered load (open model); "
                "latency at saturation says more about the CPU quota than the protocol.",
            )
        )
    return found


CONFIDENCE_LINE = (
    f"Ratios are of geometric means over repeats with their {CONFIDENCE:.0%} interval (Welch's t on the "
    "logarithms, so no interval of a positive quantity reaches zero)."
)
NONE_YET = "- No finding: the run has no successful throughput group yet."
