"""Lab against floor: each lab server's req/s and CPU per request over its floor server's (floor-<target>).

A floor target (matrix.toml, benchmarks/floor/) is named after the lab target it floors; it enters
no other comparison, since the questions between targets are about the lab's servers.
"""

from collections.abc import Sequence

from labrunner.model.questions import FLOOR_PREFIX, LAB_VS_FLOOR, is_floor
from labrunner.report.compare import THROUGHPUT, Comparison, Group, compare_groups
from labrunner.report.document import Block, Bullets, Heading, Paragraph, table
from labrunner.report.stats import CONFIDENCE, Ratio

KIND = LAB_VS_FLOOR
COMPARED = ("rps", "cpu_per_1k")


def lab_groups(groups: Sequence[Group]) -> list[Group]:
    """The groups of the lab's own targets: what the comparisons between targets take."""
    return [g for g in groups if not is_floor(g)]


def _pairs(groups: Sequence[Group]) -> list[tuple[Group, Group]]:
    """(lab, floor) throughput groups whose ids differ in the target alone (target names hold no dot):
    the same profile, payload, load model, response model and network; in a duet run, the same duet."""
    floors = {(g.target.removeprefix(FLOOR_PREFIX), _conditions(g)): g for g in groups if is_floor(g)}
    pairs = []
    for g in groups:
        floor = floors.get((g.target, _conditions(g)))
        if floor is not None and g.kind == floor.kind == THROUGHPUT and g.partner in (None, floor.target):
            pairs.append((g, floor))
    return pairs


def _conditions(group: Group) -> str:
    """A group's id past its target, without its duet partner."""
    rest = group.id.partition(".")[2]
    return rest if group.partner is None else rest.removesuffix(f".vs-{group.partner}")


def _why_not(lab: Group, floor: Group) -> str | None:
    """Why a pair has no ratio: a side without successful repeats, or only a lower bound."""
    for group in (lab, floor):
        if not group.results:
            return f"`{group.id}` has no successful repeat"
        if group.lower_bound:
            return f"`{group.id}`: {group.lower_bound}"
    return None


def floor_comparisons(groups: Sequence[Group]) -> list[Comparison]:
    """lab / floor for req/s and CPU per request, per pair with a ratio, in group order: paired by
    round (in a duet, by block), as every comparison within a run."""
    found = {(c.candidate.id, c.baseline.id): c for c in compare_groups(groups) if c.kind == KIND}
    comparisons = []
    for lab, floor in _pairs(groups):
        comparison = found.get((lab.id, floor.id))
        if comparison is not None and _why_not(lab, floor) is None:
            ratios = {m: r for m, r in comparison.ratios.items() if m in COMPARED}
            comparisons.append(Comparison(KIND, lab, floor, ratios))
    return comparisons


def section(groups: Sequence[Group]) -> list[Block]:
    """The report's section: one row per lab group with a floor, then why any pair has no ratio."""
    pairs = _pairs(groups)
    if not pairs:
        return []
    comparisons = {c.candidate.id: c for c in floor_comparisons(groups)}
    rows = []
    for lab, floor in pairs:
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
        f"`{lab.id}` against `{floor.id}`: {why}" for lab, floor in pairs if (why := _why_not(lab, floor))
    ]
    blocks: list[Block] = [
        Heading(2, "Lab against floor"),
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
        blocks.append(table(headers, rows, (False, False, False, True, True, True, True, True)))
    if missing:
        blocks += [Paragraph("Not compared:"), Bullets(tuple(missing))]
    return blocks


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
