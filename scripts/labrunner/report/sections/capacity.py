"""Capacity: the highest offered rate each group sustained within its SLO."""

from labrunner.report import charts as drawing
from labrunner.report.cells import LATENCY_FORMAT, fmt
from labrunner.report.compare import CAPACITY
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, figures, groups_of
from labrunner.report.stats import CENTRE

TITLE = "Capacity"


def applies(report: Report) -> bool:
    return bool(groups_of(report, CAPACITY))


def blocks(report: Report) -> list[Block]:
    groups = groups_of(report, CAPACITY)
    rows = []
    for g in groups:
        for result in g.results:
            if (search := result.capacity) is None:
                continue
            best = next((s for s in search.steps if s.rate == search.sustainable_rate), None)
            rows.append(
                [
                    f"`{g.id}`",
                    str(result.scenario.repeat),
                    f"{search.slo_p99_ms:g} ms",
                    fmt(search.sustainable_rate, "{:.0f}") if search.sustainable_rate else "none",
                    search.limit,
                    fmt(best.p99_ms if best else None, LATENCY_FORMAT),
                    fmt(best.service_cpu_utilisation if best else None, "{:.0%}"),
                    str(len(search.steps)),
                ]
            )
    centres = [
        f"`{g.id}`: {CENTRE} {s.centre:.0f} req/s over {s.n} repeat(s)"
        for g in groups
        if (s := g.summary("sustainable")) is not None
    ]
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "Open model (constant arrival rate): each step is one k6 run at a fixed rate; the rate grows "
            "while p99, errors and dropped iterations stay within the SLO, then bisects. Sustainable = "
            "the highest passing rate below the lowest failing one."
        ),
        table(
            (
                "group",
                "repeat",
                "SLO p99",
                "sustainable req/s",
                "limited by",
                "p99 there",
                "service CPU",
                "steps",
            ),
            rows,
            (False, True, True, True, False, True, True, True),
        ),
    ]
    if centres:
        shown.append(Bullets(tuple(centres)))
    return shown


def charts(report: Report) -> list[Block]:
    drawn = drawing.capacity(report.run.groups, report.charts_dir / "capacity.png")
    return figures([(drawn, "Capacity search: p99 by offered rate", "x: failed steps; dashed: the SLO")])


SECTION = Section(TITLE, applies, blocks, charts)
