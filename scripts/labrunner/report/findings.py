"""Findings: one sentence per answered question, with its ratio, 95% interval and what was held fixed."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The questions a run can answer, in the order findings are printed.
QUESTIONS = (
    "HTTP/2 vs HTTP/1.1",
    "gRPC vs REST",
    "server vs server",
    "gRPC streaming vs unary",
    "response model",
    "network",
    "payload",
)


@dataclass(frozen=True)
class Finding:
    """One answer. effect: how large the difference is (|ln ratio|), 0 when none is detectable; it ranks
    findings within their question. caveat: a lower bound, a suspect group or a missing comparison."""

    question: str
    sentence: str
    effect: float = 0.0
    caveat: str = ""


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Grouped by question in QUESTIONS order, largest effect first within a question."""
    order = {q: i for i, q in enumerate(QUESTIONS)}
    return sorted(findings, key=lambda f: (order.get(f.question, len(order)), -f.effect))


def markdown(findings: Sequence[Finding]) -> list[str]:
    """The findings as markdown lines: a bold question, then its sentences."""
    lines: list[str] = []
    question = None
    for finding in ranked(findings):
        if finding.question != question:
            question = finding.question
            lines.append(f"- **{question}**")
        caveat = f" ({finding.caveat})" if finding.caveat else ""
        lines.append(f"  - {finding.sentence}{caveat}")
    return lines
