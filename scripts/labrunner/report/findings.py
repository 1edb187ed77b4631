"""Findings: one sentence per answered question, with its ratio, 95% interval and what was held fixed.

Throughput and CPU per request come from saturating (closed-model) groups, latency from groups
under an offered load (open model) both compared targets carried: the highest such rate. A ratio
is "significant" after Holm's correction over the run's tests, "equivalent within ±10%" by TOST,
and otherwise "inconclusive" with its interval; a ratio whose interval is wider than
trust.MAX_INTERVAL_WIDTH is none of these, but says how many rounds it needs. Lower bounds and suspect
groups are named.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from labrunner.model.questions import is_streaming
from labrunner.model.scenario import UPLOAD
from labrunner.report.compare import THROUGHPUT, Comparison, Group, compare_groups
from labrunner.report.document import Block, Bullets, Paragraph
from labrunner.report.stats import CONFIDENCE, EQUIVALENCE_MARGIN, Ratio, holm, ratio_too_wide, samples_needed
from labrunner.results.trust import LIMITED_BY_K6, SETTLED_HALF_WIDTH, rounds_needed, verdict_of
from labrunner.run.k6_stats import PERCENTILES

# The questions a run can answer, in the order findings are printed, and the preset that asks each.
QUESTIONS = {
    "duet": "",  # the A/A control of a duet run (report/aa_control.py): how far its ratios are to trust
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
    held_fixed: str = ""  # said once for a question whose findings all hold the same fixed
    answer: bool = False  # the question's answer itself (the payload cost model): before the evidence


@dataclass(frozen=True)
class Answered:
    """The findings as read: each question with what it held fixed and its sentences, each sentence
    carrying the numbers of its notes ([1]); the notes (caveats), numbered once in reading order."""

    questions: tuple[tuple[str, str, tuple[str, ...]], ...]  # (question, held fixed, sentences)
    notes: tuple[str, ...]


def by_question(findings: Sequence[Finding], limit: int | None = None) -> Answered:
    """The findings by question and what each held fixed (a heading each), in ranked order, one line
    each, their caveats moved to numbered notes (a caveat shared by several findings is one note).
    limit: at most that many findings per heading, then a line saying how many more summary.md
    holds."""
    members: dict[tuple[str, str], list[Finding]] = {}  # (question, held fixed) -> its findings
    for finding in ranked(findings):
        members.setdefault((finding.question, finding.held_fixed), []).append(finding)
    notes: dict[str, int] = {}
    questions = []
    for (question, held), found in members.items():
        lines = []
        for finding in found[:limit]:
            caveats = [c for c in finding.caveat.split("; ") if c]
            marks = "".join(f"[{notes.setdefault(c, len(notes) + 1)}]" for c in caveats)
            lines.append(finding.sentence + (f" {marks}" if marks else ""))
        if limit is not None and len(found) > limit:
            lines.append(f"... and {len(found) - limit} more in summary.md")
        questions.append((question, held, tuple(lines)))
    return Answered(tuple(questions), tuple(notes))


def markdown_section(findings: Sequence[Finding]) -> list[str]:
    """summary.md's Findings section: the heading, the method in one line, the findings."""
    return ["## Findings", "", CONFIDENCE_LINE, "", *(markdown(findings) or [NONE_YET]), ""]


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Grouped by question in QUESTIONS order, its answers first, then largest effect first."""
    order = {q: i for i, q in enumerate(QUESTIONS)}
    return sorted(findings, key=lambda f: (order.get(f.question, len(order)), not f.answer, -f.effect))


def markdown(findings: Sequence[Finding], limit: int | None = None) -> list[str]:
    """The findings as markdown lines: a bold question with what it held fixed, its sentences, then
    the numbered notes."""
    answered = by_question(findings, limit)
    lines: list[str] = []
    for question, held, sentences in answered.questions:
        lines.append(f"- **{question}**" + (f" — {held}" if held else ""))
        lines += [f"  - {sentence}" for sentence in sentences]
    if answered.notes:
        lines.append("- Notes:")
        lines += [f"  - [{number}] {note}" for number, note in enumerate(answered.notes, start=1)]
    return lines


def blocks(findings: Sequence[Finding]) -> list[Block]:
    """The findings as a report's blocks: each question, its sentences, then the numbered notes."""
    answered = by_question(findings)
    found: list[Block] = []
    for question, held, sentences in answered.questions:
        found += [Paragraph(f"**{question}**" + (f" — {held}" if held else "")), Bullets(sentences)]
    if answered.notes:
        notes = tuple(f"[{number}] {note}" for number, note in enumerate(answered.notes, start=1))
        found += [Paragraph("**Notes**"), Bullets(notes)]
    return found


# The terminal shows each question's strongest findings (by effect); summary.md has them all.
TERMINAL_PER_QUESTION = 3


def plain(findings: Sequence[Finding], limit: int | None = TERMINAL_PER_QUESTION) -> list[str]:
    """The findings for a terminal: the question, then its strongest sentences indented, then notes."""
    return [line.replace("**", "").replace("- ", "", 1) for line in markdown(findings, limit)]


def comparisons_findings(groups: Sequence[Group]) -> list[Finding]:
    """Findings from every comparison the groups hold, plus what could not be compared and why.

    Each pair's saturation throughput and its latency at the highest load both targets carried (a
    ladder's rungs: the same share of each one's capacity) are tested; every such test of the run is
    corrected together (Holm).
    """
    throughput = [g for g in groups if g.kind == THROUGHPUT and g.results]
    closed = [g for g in throughput if executor(g) in CLOSED_EXECUTORS]
    open_groups = [g for g in throughput if executor(g) in OPEN_EXECUTORS and g.network == "loopback"]
    loaded: dict[tuple[str, str, str, int, str, str, str], Comparison] = {}
    for c in compare_groups(open_groups):
        key = _pair_key(c)
        if c.kind in _RULE_QUESTION and (key not in loaded or _preferred(c) > _preferred(loaded[key])):
            loaded[key] = c
    pairs = [(question, c, loaded.get(_pair_key(c))) for question, c in saturation_comparisons(groups)]
    families: dict[str, list[Ratio]] = {}  # metric -> the run's tests of it
    for _, c, at_load in pairs:
        for metric, r in _tested(c, at_load):
            families.setdefault(metric, []).append(r)
    judged = {key: r for family in families.values() for key, r in corrected(family).items()}
    found = [_finding(question, c, at_load, judged) for question, c, at_load in pairs]
    return found + _not_compared(closed, open_groups)


def saturation_comparisons(groups: Sequence[Group]) -> list[tuple[str, Comparison]]:
    """(question, comparison) of every pair of closed-model groups on loopback a question compares."""
    closed = [g for g in groups if g.kind == THROUGHPUT and g.results and executor(g) in CLOSED_EXECUTORS]
    return [
        (_RULE_QUESTION[c.kind], c)
        for c in compare_groups([g for g in closed if g.network == "loopback"])
        if c.kind in _RULE_QUESTION
    ]


# The note of a ratio whose own test passed and Holm's correction did not.
CORRECTED_AWAY = "not significant after Holm's correction"


def corrected(ratios: Sequence[Ratio]) -> dict[int, Ratio]:
    """Each ratio (by id) with its significance after Holm's correction over all of them (each with a
    p-value); one significant alone but not after is noted CORRECTED_AWAY."""
    adjusted = holm([r.p_value for r in ratios if r.p_value is not None])
    judged = {}
    for r, p in zip(ratios, adjusted, strict=True):
        significant = bool(p < 1 - CONFIDENCE)
        note = CORRECTED_AWAY if r.significant and not significant else r.note
        judged[id(r)] = replace(r, significant=significant, note=note)
    return judged


def _tested(closed: Comparison, at_load: Comparison | None) -> list[tuple[str, Ratio]]:
    """(metric, ratio) a pair's finding judges: saturation req/s (CPU per request at saturation is its
    reciprocal again, so it is shown, not tested again) and latency at load. Each metric is a family
    of its own, corrected over the run's pairs: req/s, p50 and p99 answer three questions."""
    tested = [("rps", closed.ratios.get("rps"))]
    if at_load is not None:
        tested += [(metric, at_load.ratios.get(metric)) for metric in ("p50", "p99")]
    return [(metric, r) for metric, r in tested if r is not None and r.p_value is not None]


def cannot_compare(groups: Sequence[Group]) -> list[Finding]:
    """When every closed-model group is only a lower bound: say so, and what would answer on this host."""
    closed = [g for g in groups if g.kind == THROUGHPUT and g.results and executor(g) in CLOSED_EXECUTORS]
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


def describe_ratio(r: Ratio | None, what: str, digits: int = 2) -> str:
    """'req/s 1.21x [1.06, 1.38]' when significant, with ', equivalent within ±10%' when TOST says
    so; else 'req/s inconclusive (1.21x [0.51, 2.87])', 'inconclusive after correction' when only
    Holm's correction over the run's tests took the significance away. An interval wider than
    trust.MAX_INTERVAL_WIDTH is no finding either way: 'p99: too few rounds: about 40 needed for ±5%'."""
    if r is None:
        return f"no {what} figure"
    value = f"{r.estimate:.{digits}f}x"
    if r.low is None or r.high is None:
        return f"{what} {value} ({r.note or 'no interval'})"
    if wide := ratio_too_wide(r):
        return f"{what}: {wide}"
    figure = f"{value} [{r.low:.{digits}f}, {r.high:.{digits}f}]"
    if r.significant:
        return f"{what} {figure}"
    if r.equivalent:
        return f"{what} {figure}, equivalent within ±{EQUIVALENCE_MARGIN:.0%}"
    after = " after correction" if r.note == CORRECTED_AWAY else ""
    return f"{what} inconclusive{after} ({figure})"


def _figure(r: Ratio | None, what: str) -> str:
    """A ratio shown without a verdict of its own: 'CPU per request 2.63x [2.40, 2.90]'."""
    if r is None:
        return f"no {what} figure"
    if wide := ratio_too_wide(r):
        return f"{what}: {wide}"
    interval = f" [{r.low:.2f}, {r.high:.2f}]" if r.low is not None and r.high is not None else ""
    return f"{what} {r.estimate:.2f}x{interval}"


def _finding(
    question: str, closed: Comparison, at_load: Comparison | None, judged: dict[int, Ratio]
) -> Finding:
    c, b = closed.candidate, closed.baseline

    def verdict(r: Ratio | None) -> Ratio | None:
        return None if r is None else judged.get(id(r), r)

    rps = verdict(closed.ratios.get("rps"))
    candidate, baseline = _names(c, b)
    if c.direction == UPLOAD == b.direction:  # the same records per request: records/s is req/s's ratio
        sentence = f"{candidate} vs {baseline}, uploading: {describe_ratio(rps, 'records/s accepted')}"
    else:
        sentence = f"{candidate} vs {baseline}: {describe_ratio(rps, 'req/s')}"
    sentence += f", {_figure(closed.ratios.get('cpu_per_1k'), 'CPU/req')}"
    if at_load is not None:
        p50, p99 = verdict(at_load.ratios.get("p50")), verdict(at_load.ratios.get("p99"))
        sentence += f"; at {_load(at_load)}: " + describe_ratio(p50, "p50")
        sentence += ", " + _tail(at_load, p99)
    decided = rps is not None and rps.significant and not ratio_too_wide(rps)
    effect = abs(math.log(rps.estimate)) if rps is not None and decided else 0.0
    return Finding(question, sentence + ".", effect, _caveat(c, b, at_load, rps), held_fixed(closed))


def _load(c: Comparison) -> str:
    """Where a latency comparison ran: a ladder rung's share of each side's capacity ("50% load"),
    else the offered rate both had ("100 req/s")."""
    share = c.candidate.results[0]["scenario"]["load_model"].get("share") if c.candidate.results else None
    return f"{share:.0%} load" if share else f"{_rate(c)} req/s"


def _utilisation(c: Comparison) -> str:
    """Each side's offered rate and service CPU there (a share of its quota): the note a latency
    finding carries, since near a full quota p99 measures the CPU quota's throttling."""
    sides = []
    for g in (c.candidate, c.baseline):
        s, throttled = g.summary("service_cpu"), g.summary("throttled_s")
        cpu = f"{s.centre:.0%}" if s is not None else "?"
        held = (
            f", throttled {throttled.centre:.2f} s" if throttled is not None and throttled.centre > 0 else ""
        )
        sides.append(f"{g.target} at {_offered_rate(g)} req/s: service CPU {cpu}{held}")
    return "; ".join(sides)


def _tail(c: Comparison, p99: Ratio | None) -> str:
    """The p99 verdict, or "no p99 interval" where the latency batches were too small for p99 (its
    note says how many samples a batch needs: _tail_note)."""
    if p99 is not None and p99.low is not None:
        return describe_ratio(p99, "p99")
    if _tail_note(c):
        return "no p99 interval"
    return describe_ratio(p99, "p99") if p99 else _unsupported(c, "p99")


def _tail_note(c: Comparison) -> str:
    """Why a latency comparison's p99 has no interval from its batches: the side whose batches held
    too few samples, and how much longer a window (or higher a load) would give them; "" otherwise."""
    needed = samples_needed(PERCENTILES["p99"])
    for g in (c.candidate, c.baseline):
        fewest = g.fewest_in_a_batch
        if fewest is not None and fewest < needed:
            return (
                f"p99: {g.target} had {fewest:,} samples a latency batch, {needed:,} needed "
                f"(a window {needed / fewest:.1f}x as long)"
            )
    return ""


def _unsupported(c: Comparison, metric: str) -> str:
    """Why a percentile of a latency comparison has no ratio: too few samples on a side."""
    short = [g for g in (c.candidate, c.baseline) if not g.supports(metric)]
    if not short:
        return f"no {metric} figure"
    return f"no {metric} ({short[0].target}: {short[0].fewest_samples:,} samples in a repeat, too few)"


def _names(candidate: Group, baseline: Group) -> tuple[str, str]:
    """The two sides by target, and by what differs when the target is the same on both (a response
    model, a profile, a network): 'aiohttp-h1 (build)' against 'aiohttp-h1 (prebuilt)'."""
    if candidate.target != baseline.target:
        return candidate.target, baseline.target
    for side in ("response_model", "direction", "profile", "network"):
        ours, theirs = getattr(candidate, side), getattr(baseline, side)
        if ours != theirs:
            return f"{candidate.target} ({ours})", f"{baseline.target} ({theirs})"
    return candidate.target, baseline.target


def held_fixed(comparison: Comparison) -> str:
    """What a comparison held fixed, in words: profile, records, response model, load, TLS, network."""
    g = comparison.candidate
    parts = [f"{g.profile} profile ({g.cpus:g} CPU)", f"{g.count} records"]
    if g.response_model and g.response_model == comparison.baseline.response_model:
        parts.append(g.response_model)
    if g.direction == UPLOAD == comparison.baseline.direction:
        parts.append("uploads")
    parts.append(f"{g.load_model} model")
    if g.tls == comparison.baseline.tls:
        parts.append("TLS" if g.tls else "no TLS")
    if g.network != "loopback":
        parts.append(g.network)
    return ", ".join(parts)


def _caveat(candidate: Group, baseline: Group, at_load: Comparison | None, rps: Ratio | None) -> str:
    notes = [_suspect(g) for g in (candidate, baseline)]
    if at_load is not None:  # the latency groups' repeats feed the finding's p50 and p99
        notes += [_suspect(g, f" at {_rate(at_load)} req/s") for g in (at_load.candidate, at_load.baseline)]
    notes.append(_rounds_needed(rps))
    if at_load is not None:
        notes += [_not_carried(g) for g in (at_load.candidate, at_load.baseline)]
        notes += [_utilisation(at_load), _tail_note(at_load)]
    return "; ".join(n for n in notes if n)


def _rounds_needed(rps: Ratio | None) -> str:
    """About how many rounds would bring the req/s ratio's interval to ±SETTLED_HALF_WIDTH
    (trust.rounds_needed), when it is wider now and not so wide that the sentence says it already."""
    if rps is None or rps.low is None or rps.high is None or rps.rounds is None or rps.rounds < 2:
        return ""
    width = max(rps.high / rps.estimate, rps.estimate / rps.low)
    if width - 1 <= SETTLED_HALF_WIDTH or ratio_too_wide(rps):
        return ""
    needed = rounds_needed(math.log(width), rps.rounds)
    return f"req/s ±{width - 1:.0%}: about {needed} rounds for ±{SETTLED_HALF_WIDTH:.0%} (--precision)"


def _suspect(group: Group, where: str = "") -> str:
    """'quart-h1 at 100 req/s: 1 of 2 repeats suspect, ...' when any of the group's repeats is; where:
    which of the target's groups it is, when the finding has more than one."""
    flagged = [r for r in group.results if r.get("suspect")]
    if not flagged:
        return ""
    return (
        f"{group.target}{where}: {len(flagged)} of {len(group.results)} repeats suspect, summary.md says why"
    )


def _not_carried(group: Group) -> str:
    rate = _offered_rate(group)
    served = group.values("rps")
    if rate is None or not served or min(served) >= CARRIED_SHARE * rate:
        return ""
    return f"{group.target} did not carry {rate} req/s (served {min(served):.0f}): its latency is a queue's"


def _offered_rate(group: Group) -> int | None:
    rate = group.results[0]["scenario"]["load_model"].get("rate") if group.results else None
    return int(rate) if rate else None


def _preferred(c: Comparison) -> tuple[bool, int]:
    """Which latency comparison of a pair a finding reads: the highest load both sides carried, else
    the highest load (its note says who did not carry it)."""
    carried = not (_not_carried(c.candidate) or _not_carried(c.baseline))
    return carried, _rate(c)


def _rate(c: Comparison) -> int:
    return _offered_rate(c.candidate) or 0


def _pair_key(c: Comparison) -> tuple[str, str, str, int, str, str, str]:
    return (
        c.kind,
        c.candidate.target,
        c.baseline.target,
        c.candidate.count,
        c.candidate.profile,
        c.candidate.response_model,
        c.candidate.direction,
    )


def _not_compared(closed: Sequence[Group], open_groups: Sequence[Group]) -> list[Finding]:
    found = []
    for g in closed:
        if g.lower_bound:
            uploads = ", uploads" if g.direction == UPLOAD else ""
            where = f"{g.target} ({g.profile}, {g.count} records{uploads}"
            where += f", beside {g.partner})" if g.partner else ")"
            found.append(
                Finding("run", f"{where}: throughput only a lower bound, {g.lower_bound}: in no ratio.")
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
                "Latency is not compared: no target ran under an offered load (open model); "
                "latency at saturation says more about the CPU quota than the protocol.",
            )
        )
    return found


CONFIDENCE_LINE = (
    f"Ratios pair the repeats of each round (a paired t-test on the logarithms, {CONFIDENCE:.0%} "
    "interval: a round the host slowed for every target cancels); significant after Holm's "
    "correction over the run's tests of each metric, "
    f"equivalent within ±{EQUIVALENCE_MARGIN:.0%} by two one-sided tests, else inconclusive; latency "
    "on k6's own timer of each request."
)
NONE_YET = "- No finding: the run has no successful throughput group yet."
