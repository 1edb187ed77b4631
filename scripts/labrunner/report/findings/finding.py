"""A finding: one sentence per answered question, with its ratio, 95% interval and what was held fixed;
its notes; the evidence every builder reads; and the words and tests the builders share."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from labrunner.model.scenario import DEFAULT_SHAPE, IDENTITY, UPLOAD, churn_words
from labrunner.report.compare import THROUGHPUT, Comparison, Group
from labrunner.report.handshakes import HandshakeCase
from labrunner.report.payload import PayloadRow
from labrunner.report.serialization import Case
from labrunner.report.stats import CONFIDENCE, Ratio, holm, ratio_too_wide

CLOSED_EXECUTORS = ("constant-vus", "ramping-vus")
OPEN_EXECUTORS = ("constant-arrival-rate",)


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
class Evidence:
    """What a run's findings are built from: its lab groups (floor targets have their own section and
    enter no finding), its body sizes (payload.json) and the serialization benchmark's cases, so the
    payload answer can say what the format costs alone (none at the end of a run: the benchmark runs
    after the findings are printed)."""

    groups: tuple[Group, ...]
    payload_rows: tuple[PayloadRow, ...] = ()
    cases: tuple[Case, ...] = ()
    handshakes: tuple[HandshakeCase, ...] = ()  # the handshake benchmark's: full against resumed TLS


def executor(group: Group) -> str:
    """The k6 executor of a group's load model."""
    return group.results[0].scenario.load_model.executor if group.results else ""


def closed_groups(groups: Sequence[Group]) -> list[Group]:
    """The saturating (closed-model) throughput groups with successful repeats."""
    return [g for g in groups if g.kind == THROUGHPUT and g.results and executor(g) in CLOSED_EXECUTORS]


def open_groups(groups: Sequence[Group]) -> list[Group]:
    """The throughput groups on loopback under an offered load (open model), with successful repeats."""
    return [
        g
        for g in groups
        if g.kind == THROUGHPUT and g.results and executor(g) in OPEN_EXECUTORS and g.network == "loopback"
    ]


def glance(
    r: Ratio | None, what: str, pair: str, digits: int = 2, undecided: str = ""
) -> tuple[str, list[Note]]:
    """A ratio as a finding's line shows it, and the notes that say why it reads so: 'p50 1.29x [1.20,
    1.40]' when significant; 'p50 ≈' when equivalent within ±10%; 'p50 ?' when inconclusive (its note
    gives the interval, then `undecided`: what would decide it); 'p50 —' when there is no interval or
    it is too wide to decide (its note says why, and over latency batches `undecided` too). req/s
    always shows its interval: 'req/s 1.01x [0.97, 1.05] ≈', 'req/s 1.18x [0.93, 1.50] ?'."""
    if r is None:
        return f"{what} —", [Note(f"{pair}: no figure", f"{what} —", VERDICT)]
    if r.low is None or r.high is None:  # the estimate alone (one repeat): said, and noted as such
        return f"{what} {r.estimate:.{digits}f}x", [
            Note(f"{pair} {what} ({r.note or 'none'})", "no interval", VERDICT)
        ]
    if wide := ratio_too_wide(r):
        if r.rounds is None:  # over latency batches: a reason many pairs share, unless what decides is known
            said = f"{pair}: {wide}, {undecided}" if undecided else wide
        else:
            said = f"{pair}: {wide}"
        return f"{what} —", [Note(said, f"{what} —", VERDICT)]
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
    undecided = f", {undecided}" if undecided else ""
    return f"{what} ?", why or [Note(f"{pair} {figure}{undecided}", f"{what} ? (inconclusive)", VERDICT)]


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


def held_by(group: Group) -> str:
    """What a finding about one group's conditions held fixed, in held_fixed's words."""
    return held_fixed(Comparison("", group, group, {}))


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
    if g.streams == comparison.baseline.streams != 1:
        parts.append(f"{g.connection_model} connections x streams")
    if g.churn == comparison.baseline.churn is not None:
        parts.append(churn_words(g.churn))
    if g.compression == comparison.baseline.compression != IDENTITY:
        parts.append(g.compression)
    if g.tls == comparison.baseline.tls:
        parts.append("TLS" if g.tls else "no TLS")
    if g.network != "loopback":
        parts.append(g.network)
    return ", ".join(parts)
