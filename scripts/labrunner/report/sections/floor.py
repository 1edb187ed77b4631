"""Lab against floor: each lab server's req/s and CPU per request over its floor server's."""

from collections.abc import Sequence

from labrunner.report.compare import Group
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.floor import floor_comparisons, pairs, why_not
from labrunner.report.sections.section import Report, Section
from labrunner.report.stats import CONFIDENCE, Ratio

TITLE = "Lab against floor"


def section(groups: Sequence[Group]) -> list[Block]:
    """One row per lab group with a floor, then why any pair has no ratio."""
    found = pairs(groups)
    comparisons = {c.candidate.id: c for c in floor_comparisons(groups)}
    rows = []
    for lab, floor in found:
        comparison = comparisons.get(lab.id)
        if comparison is None:
            continue
        rows.append(
            [
                lab.target,
                lab.response_model or "-",
                lab.context,
                f"{len(lab.results)} / {len(floor.results)}",
                _centres(lab, floor, "rps", "{:,.0f}"),
                _cell(comparison.ratios.get("rps")),
                _centres(lab, floor, "cpu_per_1k", "{:.3f}"),
                _cell(comparison.ratios.get("cpu_per_1k")),
            ]
        )
    headers = (
        "lab target",
        "response model",
        "held fixed",
        "repeats (lab / floor)",
        "req/s geometric mean (lab / floor)",
        "req/s lab / floor",
        "CPU s / 1k req geometric mean (lab / floor)",
        "CPU / req lab / floor",
    )
    missing = [
        f"`{lab.id}` against `{floor.id}`: {why}" for lab, floor in found if (why := why_not(lab, floor))
    ]
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "Each lab server against its floor (floor-<target>, benchmarks/floor/): the same contract, "
            "bytes, bad-input answers and per-request work in each response model, in its own minimal "
            "process with the records as flat tuples and none of the lab's serving code (no supervisor, "
            "metrics, middleware or drain). Ratios lab / floor paired by round (in a duet run, by "
            f"block: both at once), with {CONFIDENCE:.0%} intervals: req/s below 1 and CPU per request "
            "above 1 are the harness the lab server carries (the lab's goal: req/s at least 0.95x, CPU "
            "per request at most 1.05x)."
        ),
    ]
    if rows:
        shown.append(table(headers, rows, (False, False, False, True, True, True, True, True)))
    if missing:
        shown += [Paragraph("Not compared:"), Bullets(tuple(missing))]
    return shown


def _centres(lab: Group, floor: Group, metric: str, spec: str) -> str:
    lab_summary, floor_summary = lab.summary(metric), floor.summary(metric)
    if lab_summary is None or floor_summary is None:
        return "-"
    return f"{spec.format(lab_summary.centre)} / {spec.format(floor_summary.centre)}"


def _cell(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.estimate:.2f}x ({r.note})"
    return f"{r.estimate:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def applies(report: Report) -> bool:
    return bool(pairs(report.run.groups))


def blocks(report: Report) -> list[Block]:
    return section(report.run.groups)


SECTION = Section(TITLE, applies, blocks)
