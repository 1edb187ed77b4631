"""The findings as a reader gets them: summary.md's markdown, the report's blocks and the terminal's
lines, each question under its heading and the caveats as numbered notes."""

import itertools
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.report.document import Block, Bullets, Paragraph
from labrunner.report.findings import QUESTIONS, ranked
from labrunner.report.findings.finding import Finding
from labrunner.report.stats import CONFIDENCE, EQUIVALENCE_MARGIN


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


def _heading(question: str, held: str) -> str:
    return f"**{question}**" + (f", {held}" if held else "")


# The questions whose lines stand under no heading of their own.
_UNHEADED = {q.name for q in QUESTIONS if not q.headed}


def _lines(answered: Answered) -> list[tuple[str, str]]:
    """(heading or "", line): the A/A control's lines first and the run's last, with no heading of their
    own (they answer no question of the matrix: how far to trust the run, what it did not ask)."""
    lines: list[tuple[str, str]] = []
    for question, held, sentences in answered.questions:
        heading = "" if question in _UNHEADED else _heading(question, held)
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


CONFIDENCE_LINE = (
    f"Ratios pair the repeats of each round (a paired t-test on the logarithms, {CONFIDENCE:.0%} "
    "interval: a round the host slowed for every target cancels; a duet pair's req/s and CPU/req "
    "spread moderated by the run's other pairs, limma's moderated t); significant after Holm's "
    "correction over the run's tests of each metric, "
    f"equivalent within ±{EQUIVALENCE_MARGIN:.0%} by two one-sided tests, else inconclusive; latency "
    "on k6's own timer of each request."
)
# The method as the terminal says it, in one line (summary.md and the report give CONFIDENCE_LINE).
SHORT_METHOD = (
    f"{CONFIDENCE:.0%} paired intervals, duet spread moderated, Holm; "
    f"≈ within ±{EQUIVALENCE_MARGIN:.0%}, ? inconclusive, —: see its note"
)
LEGEND = (
    f"In the lines: ≈ equivalent within ±{EQUIVALENCE_MARGIN:.0%}, ? inconclusive, — no interval that "
    "decides (its note says why); CPU/req: the ratio of CPU time per request in the same windows as req/s."
)
NONE_YET = "- No finding: the run has no successful throughput group yet."
