"""Comparisons: every pair the rules compare, each metric's ratio; and what a bigger CPU budget buys."""

from collections.abc import Sequence

from labrunner.report import floor
from labrunner.report.cells import left_first, ratio_cell
from labrunner.report.compare import (
    CAPACITY,
    COMPARED,
    METRICS,
    SEQUENTIAL,
    THROUGHPUT,
    Comparison,
    budget_pairs,
    compare_groups,
)
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section
from labrunner.report.stats import RATIO_METHOD_LINE

TITLE = "Comparisons"


def applies(report: Report) -> bool:
    return bool(compare_groups(floor.lab_groups(report.run.groups)) or budget_pairs(report.run.groups))


def blocks(report: Report) -> list[Block]:
    comparisons = compare_groups(floor.lab_groups(report.run.groups))
    budgets = budget_pairs(report.run.groups)
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "Ratios are candidate / baseline (> 1 means more requests/s, or more latency, CPU or bytes). "
            "Pairs come from target attributes: the same server and TLS for HTTP/2 vs HTTP/1.1, the same "
            "TLS for gRPC vs REST, the same protocol and TLS for server vs server, always the same "
            f"profile, payload and load model. {RATIO_METHOD_LINE}"
        ),
    ]
    for kind in (THROUGHPUT, SEQUENTIAL, CAPACITY):
        members = [c for c in comparisons if c.candidate.kind == kind]
        if not members:
            continue
        metrics = COMPARED[kind]
        rows = [
            [c.kind, c.candidate.target, c.baseline.target, c.candidate.context, *_ratio_cells(c, metrics)]
            for c in members
        ]
        headers = ("comparison", "candidate", "baseline", "held fixed", *(METRICS[m].label for m in metrics))
        shown += [
            Heading(3, f"{kind.capitalize()} comparisons"),
            table(headers, rows, left_first(4, len(headers))),
        ]
    if budgets:
        rows = []
        for c in budgets:
            ideal = c.candidate.cpus / c.baseline.cpus
            metric = COMPARED[c.candidate.kind][0]
            r = c.ratios.get(metric)
            rows.append(
                [
                    c.candidate.target,
                    f"c{c.candidate.count}, {c.candidate.load_model}",
                    c.kind,
                    ratio_cell(r) if r else "-",
                    f"{r.estimate / ideal:.0%}" if r else "-",
                ]
            )
        shown += [
            Heading(3, "Budget scaling"),
            Paragraph(
                "Does a bigger CPU budget buy proportionally more? Scaling is the throughput ratio over "
                "the CPU ratio: 100% means doubling the budget doubled the throughput."
            ),
            table(
                ("target", "held fixed", "budgets", "throughput ratio", "scaling"),
                rows,
                (False, False, False, True, True),
            ),
        ]
    return shown


def _ratio_cells(c: Comparison, metrics: Sequence[str]) -> list[str]:
    return [ratio_cell(c.ratios[m]) if m in c.ratios else "-" for m in metrics]


SECTION = Section(TITLE, applies, blocks)
