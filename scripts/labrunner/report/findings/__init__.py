"""The questions a run's findings answer, in the order they are printed: the one registry that the
terminal, summary.md and the report read (a new question is its builder's module and one line here).

A question names the preset that asks it and the builder that finds its answers in a run's evidence;
a run that cannot answer it gets no finding from the builder, and one line names the presets that
would. The pairs' questions share one builder: Holm's correction runs over all their tests together.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from labrunner.report import payload
from labrunner.report.compare import Group
from labrunner.report.findings import aa_control, churn, compression, network, pairs, payload_sweep, run
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.floor import lab_groups
from labrunner.report.handshakes import HandshakeCase
from labrunner.report.serialization import Case


@dataclass(frozen=True)
class Question:
    name: str  # the heading its findings stand under
    asked_by: str  # the preset that asks it; "" when no preset does (every run may answer it)
    build: Callable[[Evidence], list[Finding]]  # its findings in a run; [] when the run cannot answer
    headed: bool = True  # False: its lines stand first or last under no heading (no question of the matrix)


QUESTIONS: tuple[Question, ...] = (
    Question(aa_control.QUESTION, "", aa_control.findings, headed=False),  # how far to trust the ratios
    Question(pairs.HTTP2, "default", pairs.findings),
    Question(pairs.GRPC_VS_REST, "default", pairs.findings),
    Question(pairs.SERVERS, "implementations", pairs.findings),
    Question(pairs.STREAMING, "default", pairs.findings),
    Question(pairs.RESPONSE_MODEL, "full", pairs.findings),
    Question(pairs.METRICS_OVERHEAD, "metrics-overhead", pairs.findings),
    Question(pairs.MULTIPLEXING, "multiplexing", pairs.findings),
    # Its answers (what a connection costs, fitted); pairs.findings adds each churn against connections kept.
    Question(churn.QUESTION, "churn", churn.findings),
    Question(compression.QUESTION, "compression", compression.findings),
    Question(pairs.HTTP3, "http3", pairs.findings),
    Question(pairs.DRIVER_VS_K6, "", pairs.findings),
    Question(network.QUESTION, "network", network.findings),
    Question(payload_sweep.QUESTION, "payload", payload_sweep.findings),
    Question(run.QUESTION, "", run.findings, headed=False),  # lower bounds, what was not compared
)


def for_run(
    groups: Sequence[Group],
    preset: str | None,
    payload_rows: Sequence[payload.PayloadRow] | None = None,
    cases: Sequence[Case] = (),
    handshake_cases: Sequence[HandshakeCase] = (),
) -> list[Finding]:
    """Every question's findings, ranked, and which presets would answer the questions not asked.
    payload_rows: the run's body sizes (payload.json); measured from the record pool when the run swept
    counts and none are given. handshake_cases: the handshake benchmark's (handshakes.json)."""
    lab = lab_groups(groups)
    if payload_rows is None and len({g.count for g in lab}) > 1:
        payload_rows = payload.measure()
    evidence = Evidence(tuple(lab), tuple(payload_rows or ()), tuple(cases), tuple(handshake_cases))
    builders = dict.fromkeys(q.build for q in QUESTIONS)  # each once, in the registry's order
    found = [finding for build in builders for finding in build(evidence)]
    return ranked(found + unasked(found, preset))


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Grouped by question in QUESTIONS order, its answers first, then largest effect first."""
    order = {q.name: i for i, q in enumerate(QUESTIONS)}
    return sorted(findings, key=lambda f: (order.get(f.question, len(order)), not f.answer, -f.effect))


def unasked(found: Sequence[Finding], preset: str | None) -> list[Finding]:
    """One line naming the presets that answer the questions this run did not ask."""
    asked = {f.question for f in found}
    missing: dict[str, list[str]] = {}  # preset -> its questions not asked
    for q in QUESTIONS:
        if q.asked_by and q.name not in asked and q.asked_by != preset:
            missing.setdefault(q.asked_by, []).append(q.name)
    if not missing:
        return []
    # A preset of one question is named alone; of several, with those this run did not answer.
    asks = {p: {q.name for q in QUESTIONS if q.asked_by == p} for p in missing}
    named = [p if len(asks[p]) == 1 else f"{p} ({', '.join(questions)})" for p, questions in missing.items()]
    return [Finding(run.QUESTION, "Not asked: --preset " + ", ".join(named) + ".")]
