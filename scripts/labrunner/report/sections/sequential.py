"""Sequential latency: one client sending N requests one after another."""

from labrunner.report import charts as drawing
from labrunner.report.cells import LATENCY_FORMAT, centre_cell, centre_interval_cells
from labrunner.report.compare import SEQUENTIAL
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, figures, groups_of
from labrunner.report.stats import CENTRE, CONFIDENCE, METHOD_LINE

TITLE = "Sequential latency"


def applies(report: Report) -> bool:
    return bool(groups_of(report, SEQUENTIAL))


def blocks(report: Report) -> list[Block]:
    groups = groups_of(report, SEQUENTIAL)
    rows = []
    for g in groups:
        s = g.summary("avg")
        rows.append(
            [
                g.target,
                g.protocol + (" TLS" if g.tls else ""),
                g.profile,
                str(g.count),
                str(g.iterations),
                *(centre_interval_cells(s, LATENCY_FORMAT) if s else ["0", "-", "-", "-", "-"]),
                centre_cell(g.summary("p50"), "p50"),
                centre_cell(g.summary("p99"), "p99"),
                centre_cell(g.summary("seconds"), "seconds"),
            ]
        )
    return [
        Heading(2, TITLE),
        Paragraph(
            "One client (1 VU) sends N requests one after another on one connection; each repeat is a "
            "fresh service and k6 run. The columns n to max are of the repeats' mean latency in ms; "
            f"p50, p99 and time (the k6 run for all N requests) are {CENTRE}s over repeats. {METHOD_LINE}"
        ),
        table(
            (
                "target",
                "protocol",
                "profile",
                "count",
                "N",
                "n",
                CENTRE,
                f"{CONFIDENCE:.0%} CI",
                "min",
                "max",
                "p50",
                "p99",
                "time s",
            ),
            rows,
            (False, False, False, True, True, True, True, True, True, True, True, True, True),
        ),
    ]


def charts(report: Report) -> list[Block]:
    drawn = drawing.sequential(report.run.groups, report.charts_dir / "sequential.png")
    return figures([(drawn, "Sequential mean latency by N", drawing.WHISKERS)])


SECTION = Section(TITLE, applies, blocks, charts)
