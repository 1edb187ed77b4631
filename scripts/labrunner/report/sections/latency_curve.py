"""Latency under load: p50 and p99 against the offered rate, per target (the latency-throughput curve)."""

from collections.abc import Mapping, Sequence
from typing import Any

from labrunner.report import latency_curve
from labrunner.report.compare import Group
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.latency_curve import rows
from labrunner.report.sections.section import Report, Section, figures
from labrunner.report.stats import CENTRE
from labrunner.results.store import not_run_of

TITLE = "Latency under load"


def applies(report: Report) -> bool:
    """Whether a target was offered two or more rates, or a rung was not run."""
    return bool(rows(report.run.groups) or not_run_of(report.run.manifest))


def blocks(report: Report) -> list[Block]:
    return section(report.run.groups, report.run.manifest)


def charts(report: Report) -> list[Block]:
    return figures(latency_curve.drawn(report.run.groups, report.charts_dir))


def section(groups: Sequence[Group], manifest: Mapping[str, Any]) -> list[Block]:
    """Each target at each offered rate, then the rungs not run and why."""
    found = rows(groups)
    not_run = not_run_of(manifest)
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "Each target at each offered rate of an open model (constant arrival rate: a ladder's rungs), "
            f"the {CENTRE} of its repeats: served req/s, the service's CPU as a share of its quota; and "
            "latency in ms, each percentile over every repeat's samples. Latency climbs as the offered "
            "rate nears what the service can serve (its "
            "closed-model req/s); served below offered means k6 dropped iterations, and the latency is a "
            "queue's. Streaming rows count streams, each of `count` messages."
        ),
    ]
    if found:
        headers = ("target", "held fixed", "offered /s", "ok", "served /s", "service CPU", "p50", "p99")
        shown.append(table(headers, found, (False, False, True, True, True, True, True, True)))
    if not_run:
        shown += [
            Paragraph(
                "Not run, each with why (a rung without its target's closed-model capacity in this run):"
            ),
            Bullets(tuple(f"`{scenario}`: {reason}" for scenario, reason in not_run.items())),
        ]
    return shown


SECTION = Section(TITLE, applies, blocks, charts)
