"""Findings: one sentence per answered question, with its ratio, 95% interval and what was held fixed.

Throughput and CPU per request come from saturating (closed-model) groups, latency from groups
under an offered load (open model) both compared targets carried: the highest such rate. A ratio
is "significant" after Holm's correction over the run's tests, "equivalent within ±10%" by TOST,
and otherwise "inconclusive" with its interval; a ratio whose interval is wider than
trust.MAX_INTERVAL_WIDTH is none of these, but says how many rounds it needs. Lower bounds and suspect
groups are named.
"""

import itertools
import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from labrunner.model.questions import is_streaming
from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD
from labrunner.report.compare import THROUGHPUT, Comparison, Group, compare_groups
from labrunner.report.document import Block, Bullets, Paragraph
from labrunner.report.stats import CONFIDENCE, EQUIVALENCE_MARGIN, Ratio, holm, ratio_too_wide, samples_needed
from labrunner.results.trust import LIMITED_BY_K6, SETTLED_HALF_WIDTH, rounds_needed, verdict_of
from labrunner.run.k6_stats import PERCENTILES

CONTROL_QUESTION = "duet"  # the A/A control's: its line comes first, under no heading
RUN_QUESTION = "run"  # what the run as a whole says (not asked, lower bounds): last, under no heading
# The questions a run can answer, in the order findings are printed, and the preset that asks each.
QUESTIONS = {
    CONTROL_QUESTION: "",  # a duet run's A/A control (report/aa_control.py): how far to trust its ratios
    "HTTP/2 vs HTTP/1.1": "default",
    "gRPC vs REST": "default",
    "server vs server": "implementations",
    "gRPC streaming vs unary": "default",
    "response model": "full",
    "metrics on vs off": "metrics-overhead",
    "network": "network",
    "payload": "payload",
    RUN_QUESTION: "",
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
    notes: tuple["Note", ...] = ()  # a pair's caveats, each about one target at one load or one verdict
    load: str = ""  # where a pair's latency was compared ("40% load"): said once when all share it

    @property
    def all_notes(self) -> list["Note"]:
        """The caveat's parts (a caveat in words, such as a lower bound or a share below the quota, is
        about whether to trust the line), then the notes."""
        return [Note(c, rank=VERDICT) for c in self.caveat.split("; ") if c] + list(self.notes)

    @property
    def caveats(self) -> list[str]:
        """Every caveat as it reads alone."""
        return [n.alone for n in self.all_notes]


# How much a note matters to a reader at a glance; the terminal keeps the lowest ranks when it must cut.
SUSPECT, VERDICT, PRECISION, CONDITIONS = range(4)


@dataclass(frozen=True)
class Note:
    """A caveat of a finding. Notes with the same subject (a target at a load, a kind of verdict) are
    one note: 'subject: detail; detail'; a note without a subject is its detail, and identical ones
    are one note too."""

    detail: str
    subject: str = ""
    rank: int = CONDITIONS

    @property
    def alone(self) -> str:
        return f"{self.subject}: {self.detail}" if self.subject else self.detail


@dataclass(frozen=True)
class Answered:
    """The findings as read: what every heading held fixed (shared), each question with what else it
    held fixed and its lines, each line carrying the numbers of its notes ([1, 2]); the notes,
    numbered once in reading order, each with its rank."""

    shared: str  # what every heading held fixed, and where latency was compared when all agree
    questions: tuple[tuple[str, str, tuple[str, ...]], ...]  # (question, held fixed besides, lines)
    notes: tuple[tuple[str, int], ...]  # (text, rank), number = position + 1
    shown: frozenset[int] = frozenset()  # the numbers of the notes the lines held refer to


def by_question(findings: Sequence[Finding], limit: int | None = None) -> Answered:
    """The findings by question and what each held fixed (a heading each), in ranked order, one line
    each, their caveats moved to numbered notes: notes with one subject combine, identical ones merge.
    What every heading held fixed is said once (shared), and so is the load latency was compared at
    when every pair's is the same. limit: at most that many findings per heading, then a line saying
    how many more summary.md holds (the notes are numbered over all the findings, as summary.md
    numbers them; shown says which the lines held refer to)."""
    members: dict[tuple[str, str], list[Finding]] = {}  # (question, held fixed) -> its findings
    for finding in ranked(findings):
        members.setdefault((finding.question, finding.held_fixed), []).append(finding)
    helds = [held.split(", ") for _, held in members if held]
    common = [part for part in helds[0] if all(part in h for h in helds)] if helds else []
    loads = {f.load for f in findings if f.load}
    shared = "; ".join(
        s for s in (", ".join(common), f"latency at {min(loads)}" if len(loads) == 1 else "") if s
    )
    details: dict[str, list[str]] = {}  # subject (or the text of a note without one) -> details
    ranks: dict[str, int] = {}
    questions = []
    shown: set[int] = set()
    for (question, held), found in members.items():
        lines = []
        for position, finding in enumerate(found):
            marks = []
            for note in finding.all_notes:
                key = note.subject or note.detail
                said = details.setdefault(key, [])
                if note.subject and note.detail not in said:
                    said.append(note.detail)
                ranks[key] = min(ranks.get(key, note.rank), note.rank)
                number = list(details).index(key) + 1
                if number not in marks:
                    marks.append(number)
            line = finding.sentence
            if finding.load and len(loads) > 1:
                line = line.replace(", p50 ", f", at {finding.load}: p50 ", 1)
            if limit is None or position < limit:
                lines.append(line + (f" [{','.join(map(str, sorted(marks)))}]" if marks else ""))
                shown.update(marks)
        if limit is not None and len(found) > limit:
            lines.append(f"... and {len(found) - limit} more in summary.md")
        rest = ", ".join(p for p in held.split(", ") if p and p not in common)
        questions.append((question, rest, tuple(lines)))
    texts = tuple((f"{key}: {'; '.join(said)}" if said else key, ranks[key]) for key, said in details.items())
    return Answered(shared, tuple(questions), texts, frozenset(shown))


def markdown_section(findings: Sequence[Finding]) -> list[str]:
    """summary.md's Findings section: the heading, the findings and their notes, then the method."""
    return ["## Findings", "", *(markdown(findings) or [NONE_YET]), "", CONFIDENCE_LINE + " " + LEGEND, ""]


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Grouped by question in QUESTIONS order, its answers first, then largest effect first."""
    order = {q: i for i, q in enumerate(QUESTIONS)}
    return sorted(findings, key=lambda f: (order.get(f.question, len(order)), not f.answer, -f.effect))


def _heading(question: str, held: str) -> str:
    return f"**{question}**" + (f", {held}" if held else "")


def _lines(answered: Answered) -> list[tuple[str, str]]:
    """(heading or "", line): the A/A control's lines first and the run's last, with no heading of their
    own (they answer no question of the matrix: how far to trust the run, what it did not ask)."""
    lines: list[tuple[str, str]] = []
    for question, held, sentences in answered.questions:
        heading = "" if question in (CONTROL_QUESTION, RUN_QUESTION) else _heading(question, held)
        lines += [(heading, sentence) for sentence in sentences]
    return lines


def markdown(findings: Sequence[Finding], limit: int | None = None) -> list[str]:
    """The findings as markdown lines: what they all held fixed, each bold question with what else it
    held fixed, its lines, then the numbered notes."""
    answered = by_question(findings, limit)
    lines: list[str] = [f"All held fixed: {answered.shared}.", ""] if answered.shared else []
    for heading, members in itertools.groupby(_lines(answered), key=lambda line: line[0]):
        lines += [f"- {heading}"] if heading else []
        lines += [f"  - {sentence}" if heading else f"- {sentence}" for _, sentence in members]
    if answered.notes:
        lines += ["", "Notes:", ""]
        lines += [f"- [{number}] {note}" for number, (note, _) in enumerate(answered.notes, start=1)]
    return lines


def blocks(findings: Sequence[Finding]) -> list[Block]:
    """The findings as a report's blocks: what they all held fixed, each question with its lines,
    the numbered notes."""
    answered = by_question(findings)
    found: list[Block] = [Paragraph(f"All held fixed: {answered.shared}.")] if answered.shared else []
    for heading, members in itertools.groupby(_lines(answered), key=lambda line: line[0]):
        found += [Paragraph(heading)] if heading else []
        found.append(Bullets(tuple(sentence for _, sentence in members)))
    if answered.notes:
        notes = tuple(f"[{number}] {note}" for number, (note, _) in enumerate(answered.notes, start=1))
        found += [Paragraph("**Notes**"), Bullets(notes)]
    return found


# The terminal shows each question's strongest findings (by effect); summary.md has them all.
TERMINAL_PER_QUESTION = 3
# The terminal's answer fits a screen this wide and high (rows counted after wrapping): hyperfine's
# verdict fits one screen, and so does this one, its notes cut to the most important when they overflow.
SCREEN_COLUMNS, SCREEN_ROWS = 80, 40
# No terminal line is longer: a longer sentence (a payload or network finding, a note that combines
# many) is wrapped to WRAP_AT, its continuation indented under its start.
LONGEST_LINE, WRAP_AT = 120, 100


def rows(lines: Sequence[str], columns: int = SCREEN_COLUMNS) -> int:
    """How many rows of a terminal `columns` wide the lines take, each long one wrapped."""
    return sum(max(1, -(-len(line) // columns)) for line in lines)


def plain(
    findings: Sequence[Finding], limit: int | None = TERMINAL_PER_QUESTION, screen: int = SCREEN_ROWS
) -> list[str]:
    """The findings for a terminal, from the "findings:" line on: what all held fixed, the method in
    one line, the lines under their headings, the notes; when they would take more than `screen`
    rows, the most important notes (by rank, then number) and how many more summary.md holds."""
    answered = by_question(findings, limit)
    if not answered.questions:
        return ["findings: " + NONE_YET.removeprefix("- ")]
    lines = [f"findings: {answered.shared}" if answered.shared else "findings:", f"  {SHORT_METHOD}"]
    for heading, members in itertools.groupby(_lines(answered), key=lambda line: line[0]):
        lines += ["  " + heading.replace("**", "")] if heading else []
        lines += [f"    {sentence}" if heading else f"  {sentence}" for _, sentence in members]
    notes = [f"  [{number}] {note}" for number, (note, _) in enumerate(answered.notes, start=1)]
    if not notes:
        return _wrapped(lines)
    kept = [i for i in range(len(notes)) if i + 1 in answered.shown]
    by_importance = sorted(kept, key=lambda i: (answered.notes[i][1], i))

    def shown() -> list[str]:
        return _wrapped([*lines, *(notes[i] for i in kept), *_more(len(notes) - len(kept))])

    while kept and rows(shown()) > screen:
        kept.remove(by_importance.pop())
    return shown()


def _wrapped(lines: Sequence[str]) -> list[str]:
    """Each line longer than LONGEST_LINE wrapped to WRAP_AT, its continuation two columns further in."""
    out: list[str] = []
    for line in lines:
        if len(line) <= LONGEST_LINE:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out += textwrap.wrap(line, WRAP_AT, subsequent_indent=indent, break_on_hyphens=False)
    return out


def _more(hidden: int) -> list[str]:
    return [f"  {hidden} more note{'s' if hidden > 1 else ''} in summary.md"] if hidden else []


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
            RUN_QUESTION,
            f"No comparison between targets: every one of {len(closed)} closed-model groups is only a "
            f"lower bound of its service ({closed[0].lower_bound}), so this run measured its load "
            f"generator or host, not the servers; {remedy}.",
        )
    ]


def unasked(found: Sequence[Finding], preset: str | None) -> list[Finding]:
    """One line naming the presets that answer the questions this run did not ask."""
    asked = {f.question for f in found}
    missing: dict[str, list[str]] = {}  # preset -> its questions not asked
    for question, asks in QUESTIONS.items():
        if asks and question not in asked and asks != preset:
            missing.setdefault(asks, []).append(question)
    if not missing:
        return []
    named = [p if questions == [p] else f"{p} ({', '.join(questions)})" for p, questions in missing.items()]
    return [Finding(RUN_QUESTION, "Not asked: --preset " + ", ".join(named) + ".")]


def executor(group: Group) -> str:
    """The k6 executor of a group's load model."""
    return group.results[0].scenario.load_model.executor if group.results else ""


def glance(r: Ratio | None, what: str, pair: str, digits: int = 2) -> tuple[str, list[Note]]:
    """A ratio as a finding's line shows it, and the notes that say why it reads so: 'p50 1.29x [1.20,
    1.40]' when significant; 'p50 ≈' when equivalent within ±10%; 'p50 ?' when inconclusive (its note
    gives the interval); 'p50 —' when there is no interval or it is too wide to decide (its note says
    why). req/s always shows its interval: 'req/s 1.01x [0.97, 1.05] ≈', 'req/s 1.18x [0.93, 1.50] ?'."""
    if r is None:
        return f"{what} —", [Note(f"{pair}: no figure", f"{what} —", VERDICT)]
    if r.low is None or r.high is None:  # the estimate alone (one repeat): said, and noted as such
        return f"{what} {r.estimate:.{digits}f}x", [
            Note(f"{pair} {what} ({r.note or 'none'})", "no interval", VERDICT)
        ]
    if wide := ratio_too_wide(r):
        return f"{what} —", [Note(wide if r.rounds is None else f"{pair}: {wide}", f"{what} —", VERDICT)]
    figure = f"{r.estimate:.{digits}f}x [{r.low:.{digits}f}, {r.high:.{digits}f}]"
    always = what not in {"p50", "p99"}  # throughput's interval is the line's point
    if r.significant:
        return f"{what} {figure}", []
    after = r.note == CORRECTED_AWAY
    why = [Note(pair, f"{what} ? (significant alone, not after Holm's correction)", VERDICT)] if after else []
    if r.equivalent and not after:
        return (f"{what} {figure} ≈" if always else f"{what} ≈"), []
    if always:
        return f"{what} {figure} ?", why
    return f"{what} ?", why or [Note(f"{pair} {figure}", f"{what} ? (inconclusive)", VERDICT)]


def _figure(r: Ratio | None, what: str) -> str:
    """A ratio shown without a verdict or an interval of its own: 'CPU/req 2.63x' (the req/s beside
    it carries the test and the interval), '—' when there is none or its interval decides nothing."""
    if r is None or ratio_too_wide(r):
        return f"{what} —"
    return f"{what} {r.estimate:.2f}x"


def _finding(
    question: str, closed: Comparison, at_load: Comparison | None, judged: dict[int, Ratio]
) -> Finding:
    """A pair's line: req/s with its interval and verdict, CPU per request, and latency's p50 and p99
    verdicts at the highest load both carried; its caveats as notes (_notes)."""
    c, b = closed.candidate, closed.baseline

    def verdict(r: Ratio | None) -> Ratio | None:
        return None if r is None else judged.get(id(r), r)

    rps = verdict(closed.ratios.get("rps"))
    candidate, baseline = _names(c, b)
    pair = f"{candidate} vs {baseline}"
    if c.direction == UPLOAD == b.direction:  # the same records per request: records/s is req/s's ratio
        cell, notes = glance(rps, "records/s accepted", pair)
        line = f"{pair}, uploading: {cell}"
    else:
        cell, notes = glance(rps, "req/s", pair)
        line = f"{pair}: {cell}"
    line += f", {_figure(closed.ratios.get('cpu_per_1k'), 'CPU/req')}"
    load = ""
    if at_load is not None:
        load = _load(at_load)
        for metric in ("p50", "p99"):
            r = verdict(at_load.ratios.get(metric))
            if metric == "p99" and (r is None or r.low is None) and _short_batches(at_load):
                cell, why = "p99 —", [Note(_P99_SHORT, rank=VERDICT)]
            elif r is None:
                cell, why = f"{metric} —", [Note(_unsupported(at_load, metric), f"{metric} —", VERDICT)]
            else:
                cell, why = glance(r, metric, pair)
            line += f", {cell}"
            notes += why
    decided = rps is not None and rps.significant and not ratio_too_wide(rps)
    effect = abs(math.log(rps.estimate)) if rps is not None and decided else 0.0
    notes = _notes(c, b, at_load, rps, pair) + notes
    return Finding(question, line, effect, held_fixed=held_fixed(closed), notes=tuple(notes), load=load)


def _load(c: Comparison) -> str:
    """Where a latency comparison ran: a ladder rung's share of each side's capacity ("50% load"),
    else the offered rate both had ("100 req/s")."""
    share = c.candidate.results[0].scenario.load_model.share if c.candidate.results else None
    return f"{share:.0%} load" if share else f"{_rate(c)} req/s"


def _at(g: Group) -> str:
    """A latency group by its target and offered rate: the subject of every note about it."""
    return f"{g.target} at {_offered_rate(g)} req/s"


def _conditions(g: Group) -> Note:
    """A latency group's service CPU there (a share of its quota), its throttled seconds, and the
    samples of its smallest latency batch when too few for p99: near a full quota p99 measures the CPU
    quota's throttling, not the protocol."""
    s, throttled = g.summary("service_cpu"), g.summary("throttled_s")
    parts = [f"CPU {s.centre:.0%}" if s is not None else "CPU ?"]
    if throttled is not None and throttled.centre > 0:
        parts.append(f"throttled {throttled.centre:.2f} s")
    fewest = g.fewest_in_a_batch
    if fewest is not None and fewest < samples_needed(PERCENTILES["p99"]):
        parts.append(f"{fewest:,} samples a batch")
    return Note(", ".join(parts), _at(g), CONDITIONS)


def _short_batches(c: Comparison) -> bool:
    """Whether a side's latency batches held too few samples for p99 (its note says how many)."""
    needed = samples_needed(PERCENTILES["p99"])
    return any(
        g.fewest_in_a_batch is not None and g.fewest_in_a_batch < needed for g in (c.candidate, c.baseline)
    )


# Why a pair's p99 has no interval when its latency batches were too small: the same for every pair.
_P99_SHORT = (
    f"p99 —: latency batches under the {samples_needed(PERCENTILES['p99']):,} samples p99 needs "
    "(longer windows)"
)


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
    for side in ("response_model", "direction", "shape", "profile", "network"):
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
    if g.shape != DEFAULT_SHAPE:
        parts.append(f"{g.shape} records")
    parts.append(f"{g.load_model} model")
    if g.tls == comparison.baseline.tls:
        parts.append("TLS" if g.tls else "no TLS")
    if g.network != "loopback":
        parts.append(g.network)
    return ", ".join(parts)


def _notes(
    candidate: Group, baseline: Group, at_load: Comparison | None, rps: Ratio | None, pair: str
) -> list[Note]:
    """A pair's caveats: its saturated groups' suspect repeats; how many rounds would bring req/s to
    ±SETTLED_HALF_WIDTH; each latency side at its load (suspect repeats, whether it carried the rate,
    its service CPU, throttling and batch size), one note per side combining them. A duet's groups
    ran for this pair alone: what is said of them is said of the pair, in one note with its rounds."""
    notes = [n for g in (candidate, baseline) if (n := _saturated_suspect(g, pair))]
    if needed := _rounds_needed(rps):
        notes.append(Note(needed, pair, PRECISION))
    if at_load is not None:
        for g in (at_load.candidate, at_load.baseline):
            notes += [n for n in (_suspect(g, _at(g)), _not_carried(g)) if n] + [_conditions(g)]
    return notes


def _saturated_suspect(g: Group, pair: str) -> Note | None:
    """A closed-model group's suspect repeats: said of the pair when the group is a duet's (it ran
    beside the pair's other side only), else of the target's closed model (every pair it is in)."""
    if g.partner is None:
        return _suspect(g, f"{g.target}, closed model")
    flagged = sum(1 for r in g.results if r.suspect)
    detail = f"{flagged} of {len(g.results)} repeats of {g.target} suspect, see summary.md"
    return Note(detail, pair, SUSPECT) if flagged else None


def _rounds_needed(rps: Ratio | None) -> str:
    """About how many rounds would bring the req/s ratio's interval to ±SETTLED_HALF_WIDTH
    (trust.rounds_needed), when it is wider now and not so wide that the line says it already."""
    if rps is None or rps.low is None or rps.high is None or rps.rounds is None or rps.rounds < 2:
        return ""
    width = max(rps.high / rps.estimate, rps.estimate / rps.low)
    if width - 1 <= SETTLED_HALF_WIDTH or ratio_too_wide(rps):
        return ""
    needed = rounds_needed(math.log(width), rps.rounds)
    return f"req/s ±{width - 1:.0%}: about {needed} rounds for ±{SETTLED_HALF_WIDTH:.0%} (--precision)"


def _suspect(group: Group, subject: str) -> Note | None:
    """'1 of 2 repeats suspect, see summary.md' about the group, when any of its repeats is."""
    flagged = [r for r in group.results if r.suspect]
    if not flagged:
        return None
    return Note(f"{len(flagged)} of {len(group.results)} repeats suspect, see summary.md", subject, SUSPECT)


def _not_carried(group: Group) -> Note | None:
    """'did not carry it (served 30): its latency is a queue's' when a repeat served less than
    CARRIED_SHARE of the offered rate."""
    rate = _offered_rate(group)
    served = group.values("rps")
    if rate is None or not served or min(served) >= CARRIED_SHARE * rate:
        return None
    return Note(f"did not carry it (served {min(served):.0f}): its latency is a queue's", _at(group), VERDICT)


def _offered_rate(group: Group) -> int | None:
    rate = group.results[0].scenario.load_model.rate if group.results else None
    return int(rate) if rate else None


def _preferred(c: Comparison) -> tuple[bool, int]:
    """Which latency comparison of a pair a finding reads: the highest load both sides carried, else
    the highest load (its note says who did not carry it)."""
    carried = _not_carried(c.candidate) is None and _not_carried(c.baseline) is None
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
                Finding(
                    RUN_QUESTION, f"{where}: throughput only a lower bound, {g.lower_bound}: in no ratio."
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
                RUN_QUESTION,
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
# The method as the terminal says it, in one line (summary.md and the report give CONFIDENCE_LINE).
SHORT_METHOD = (
    f"{CONFIDENCE:.0%} paired intervals, Holm; ≈ within ±{EQUIVALENCE_MARGIN:.0%}, ? inconclusive, "
    "—: see its note"
)
LEGEND = (
    f"In the lines: ≈ equivalent within ±{EQUIVALENCE_MARGIN:.0%}, ? inconclusive, — no interval that "
    "decides (its note says why); CPU/req: the ratio of CPU time per request in the same windows as req/s."
)
NONE_YET = "- No finding: the run has no successful throughput group yet."
