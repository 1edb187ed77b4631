"""summary.md's view across repeats: each group's geometric mean and interval, and the ratios between
targets."""

from collections.abc import Iterable

from labrunner.report.cells import interval_text
from labrunner.report.compare import THROUGHPUT, Group, compare_groups, group_results
from labrunner.report.floor import floor_comparisons, lab_groups
from labrunner.report.stats import (
    CENTRE,
    CONFIDENCE,
    METHOD_LINE,
    RATIO_METHOD_LINE,
    Ratio,
    Summary,
    ratio_too_wide,
)
from labrunner.results.result import Result


def across_repeats_markdown(results: Iterable[Result]) -> list[str]:
    """Markdown lines: one row per throughput group, then the comparisons; [] without such groups."""
    groups = [g for g in group_results(results) if g.kind == THROUGHPUT]
    if not groups:
        return []
    lines = [
        "## Across repeats",
        "",
        f"{CENTRE.capitalize()} [{CONFIDENCE:.0%} interval] over the group's successful repeats "
        f'("one repeat": no interval). {METHOD_LINE} A lower bound is a closed-model throughput that k6 or '
        "something else, not the service, limited: it enters no ratio.",
        "",
        "| group | ok | req/s | p50 ms | p99 ms | CPU s / 1k req | lower bound |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for g in groups:
        cells = [
            f"`{g.id}`",
            f"{len(g.results)}/{g.attempted}",
            _centre(g.summary("rps"), "{:,.1f}"),
            _centre(g.summary("p50"), "{:.2f}"),
            _centre(g.summary("p99"), "{:.2f}"),
            _centre(g.summary("cpu_per_1k"), "{:.3f}"),
            g.lower_bound or "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    comparisons = [
        c for c in compare_groups(lab_groups(groups)) + floor_comparisons(groups) if "rps" in c.ratios
    ]
    if comparisons:
        lines += [
            "",
            f"Ratios candidate / baseline with their {CONFIDENCE:.0%} interval (> 1: more req/s, or more "
            f"CPU per request). {RATIO_METHOD_LINE}",
            "",
            "| comparison | candidate | baseline | held fixed | req/s | CPU s / 1k req |",
            "|---|---|---|---|--:|--:|",
        ]
        for c in comparisons:
            cells = [
                c.kind,
                c.candidate.target,
                c.baseline.target,
                c.candidate.context + _models(c.candidate, c.baseline),
                _ratio(c.ratios.get("rps")),
                _ratio(c.ratios.get("cpu_per_1k")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _models(candidate: Group, baseline: Group) -> str:
    same = candidate.response_model == baseline.response_model
    return f", {candidate.response_model}" if same and candidate.response_model else ""


def _centre(s: Summary | None, spec: str) -> str:
    if s is None:
        return "-"
    if s.low is None or s.high is None:
        return f"{spec.format(s.centre)} ({s.note.removeprefix('n/a: ')})"
    return f"{spec.format(s.centre)} {interval_text(s, spec)}"


def _ratio(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.estimate:.2f}"
    if wide := ratio_too_wide(r):
        return f"— ({wide})"
    return f"{r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]"
