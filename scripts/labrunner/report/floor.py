"""Lab against floor: each lab server's req/s and CPU per request over its floor server's (floor-<target>).

A floor target (matrix.toml, benchmarks/floor/) is named after the lab target it floors; it enters
no other comparison, since the questions between targets are about the lab's servers.
"""

from collections.abc import Sequence

from labrunner.model.questions import FLOOR_PREFIX, LAB_VS_FLOOR, is_floor
from labrunner.report.compare import THROUGHPUT, Comparison, Group, compare_groups

KIND = LAB_VS_FLOOR
COMPARED = ("rps", "cpu_per_1k")


def lab_groups(groups: Sequence[Group]) -> list[Group]:
    """The groups of the lab's own targets: what the comparisons between targets take."""
    return [g for g in groups if not is_floor(g)]


def pairs(groups: Sequence[Group]) -> list[tuple[Group, Group]]:
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


def why_not(lab: Group, floor: Group) -> str | None:
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
    for lab, floor in pairs(groups):
        comparison = found.get((lab.id, floor.id))
        if comparison is not None and why_not(lab, floor) is None:
            ratios = {m: r for m, r in comparison.ratios.items() if m in COMPARED}
            comparisons.append(Comparison(KIND, lab, floor, ratios))
    return comparisons
