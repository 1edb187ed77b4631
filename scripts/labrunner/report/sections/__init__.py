"""The report's sections in reading order: report.md and report.html are these, one after another, the
one registry of them (a new section is its module and one line here).

Each section is a module whose SECTION (sections/section.py) says its title, whether it applies to a
report, its blocks and its charts; the Charts section shows every section's charts in this order.
"""

from labrunner.report.document import Block, Heading
from labrunner.report.sections import (
    baseline,
    capacity,
    comparisons,
    connections,
    findings,
    floor,
    host_conditions,
    latency,
    latency_curve,
    network,
    payload_size,
    payload_sweep,
    problems,
    provenance,
    sequential,
    serialization,
    summary,
)
from labrunner.report.sections.section import Report, Section, always

CHARTS_TITLE = "Charts"


def _charts(report: Report) -> list[Block]:
    """Every section's charts, in the sections' order (each draws only what its data holds)."""
    return [Heading(2, CHARTS_TITLE), *(block for section in SECTIONS for block in section.charts(report))]


SECTIONS: tuple[Section, ...] = (
    findings.SECTION,
    summary.SECTION,
    latency.SECTION,
    latency_curve.SECTION,
    sequential.SECTION,
    capacity.SECTION,
    comparisons.SECTION,
    floor.SECTION,
    network.SECTION,
    connections.SECTION,
    payload_sweep.SECTION,
    host_conditions.SECTION,
    baseline.SECTION,
    Section(CHARTS_TITLE, always, _charts),
    payload_size.SECTION,
    serialization.SECTION,
    problems.SECTION,
    provenance.SECTION,
)
