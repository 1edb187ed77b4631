"""The failed and suspect results, each with why."""

from labrunner.report.document import Block, Bullets, Heading, Paragraph
from labrunner.report.sections.section import Report, Section, always
from labrunner.results.trust import verdict_of

TITLE = "Failed and suspect results"


def blocks(report: Report) -> list[Block]:
    items = []
    for r in report.run.results:
        if r.failure:
            items.append(f"`{r.scenario_id}` failed in {r.failure.phase}: {r.failure.message}")
        items += [f"`{r.scenario_id}` suspect: {reason}" for reason in verdict_of(r).suspect]
    return [Heading(2, TITLE), Bullets(tuple(items)) if items else Paragraph("None.")]


SECTION = Section(TITLE, always, blocks)
