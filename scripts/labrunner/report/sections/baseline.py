"""Against the baseline run: the change of every group, and which are regressions."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from labrunner.report import host_conditions
from labrunner.report.cells import fmt, metric_format
from labrunner.report.compare import (
    CAPACITY,
    COMPARED,
    IMPROVEMENT,
    LARGE_CHANGE,
    LARGE_NOT_SIGNIFICANT,
    LARGE_UNJUDGED,
    METRICS,
    NOT_COMPARED,
    REGRESSION,
    SEQUENTIAL,
    THROUGHPUT,
    UNJUDGED,
    VERDICTS,
    WITHIN_NOISE,
    BaselineChange,
    Comparison,
    Group,
    baseline_changes,
    compare_groups,
)
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.runs import Run
from labrunner.report.sections.section import Report, Section
from labrunner.report.stats import CONFIDENCE, ONE_REPEAT, Ratio
from labrunner.results import methodology

TITLE = "Against baseline run"  # and its id
# The verdict on an absolute change (req/s, latency, CPU per request) between two hosts' runs.
DIFFERENT_HOST = "different host: not judged"


def applies(report: Report) -> bool:
    return report.baseline is not None


def blocks(report: Report) -> list[Block]:
    assert report.baseline is not None  # applies
    return section(report.run, report.baseline)


def section(run: Run, baseline: Run) -> list[Block]:
    changes = baseline_changes(run.groups, baseline.groups)
    differences = host_conditions.host_differences(run.manifest, baseline.manifest)
    shown: list[Block] = [Heading(2, f"{TITLE} {baseline.run_id}")]
    now, then = methodology.version_of(run.manifest), methodology.version_of(baseline.manifest)
    if now != then:
        changes = _comparable(changes, now, then)
        shown.append(Paragraph(_methods_differ(now, then, baseline.run_id)))
    if differences:
        shown.append(
            Paragraph(
                f"**The runs come from different hosts**: {'; '.join(differences)}. An absolute change "
                "mixes code and machine, so none is judged a regression; the ratios between targets of "
                "each run, compared side by side below, are what travels between hosts."
            )
        )
    shown.append(
        Paragraph(
            f"Each group of this run against the same group of {baseline.path}; ratio = this run / "
            f"baseline, with its Welch {CONFIDENCE:.0%} interval where both runs have repeats. A "
            "regression is a significant change for the worse: fewer requests/s or more latency or CPU "
            "per request. With one repeat in either run no test can tell a change from noise, so such a "
            f"group is not judged; a change beyond ±{LARGE_CHANGE:.0%} is flagged, tested or not."
        )
    )
    sha_now, sha_then = run.manifest.get("git", {}).get("sha"), baseline.manifest.get("git", {}).get("sha")
    if differences is None:
        shown.append(
            Paragraph(
                "The baseline has no host fingerprint (recorded before runs carried one): the hosts "
                "are compared by CPU model only."
                if not baseline.manifest.get("fingerprint")
                else "This run has no host fingerprint: the hosts are compared by CPU model only."
            )
        )
        host_now, host_then = run.manifest.get("host", {}), baseline.manifest.get("host", {})
        if host_now.get("cpu_model") != host_then.get("cpu_model"):
            shown.append(Paragraph("**Different hosts**: the change mixes code and machine."))
    shown.append(Paragraph(f"Code: `{sha_then}` then, `{sha_now}` now."))
    shown += host_conditions.baseline_warnings(run.manifest, baseline.manifest, baseline.run_id)
    shown.append(
        Paragraph(_different_hosts_findings(changes) if differences else _baseline_findings(changes))
    )
    for kind in (THROUGHPUT, SEQUENTIAL, CAPACITY):
        members = [c for c in changes if c.current.kind == kind]
        if not members:
            continue
        metrics = COMPARED[kind]
        first = metrics[0]
        headers = (
            "group",
            "repeats (baseline / now)",
            f"baseline → now ({METRICS[first].label}, geometric mean)",
            *(METRICS[m].label for m in metrics),
            "verdict",
        )
        rows = [
            [
                f"`{c.id}`",
                f"{len(c.baseline.results)} / {len(c.current.results)}",
                f"{_centre(c.baseline, first)} → {_centre(c.current, first)}",
                *(_baseline_cell(c.ratios.get(m)) for m in metrics),
                DIFFERENT_HOST if differences and c.comparison is not None else _verdict_cell(c),
            ]
            for c in members
        ]
        shown += [
            Heading(3, f"{kind.capitalize()} groups against the baseline"),
            table(headers, rows, (False, *(True,) * (len(headers) - 2), False)),
        ]
    if differences:
        shown += _ratios_side_by_side(run, baseline)
    ids_now, ids_then = {g.id for g in run.groups}, {g.id for g in baseline.groups}
    for ids, where in ((ids_now - ids_then, "this run"), (ids_then - ids_now, "the baseline")):
        if ids:
            shown.append(Paragraph(f"Only in {where}: " + ", ".join(f"`{m}`" for m in sorted(ids)) + "."))
    return shown


# How the findings sentence counts each verdict: (one, several).
_FINDINGS = {
    REGRESSION: ("significant regression", "significant regressions"),
    IMPROVEMENT: ("significant improvement", "significant improvements"),
    LARGE_UNJUDGED: ("large unjudged change", "large unjudged changes"),
    LARGE_NOT_SIGNIFICANT: ("large non-significant change", "large non-significant changes"),
    UNJUDGED: (
        f"unjudged group with changes within ±{LARGE_CHANGE:.0%}",
        f"unjudged groups with changes within ±{LARGE_CHANGE:.0%}",
    ),
    WITHIN_NOISE: ("group within noise", "groups within noise"),
    NOT_COMPARED: (
        "group without a successful repeat in one run",
        "groups without a successful repeat in one run",
    ),
}


def _baseline_findings(changes: Sequence[BaselineChange]) -> str:
    """What the comparison found; "no regression" only when every group was judged and none changed."""
    if not changes:
        return "No group is present in both runs: nothing to compare."
    counts = Counter(c.verdict for c in changes)
    if counts[WITHIN_NOISE] == len(changes):
        return (
            f"No regression among {len(changes)} group{'s' if len(changes) > 1 else ''} present in both "
            "runs: every group has repeats in both runs and none changed significantly."
        )
    parts = []
    for verdict in VERDICTS:
        n = counts[verdict]
        if n:
            one, several = _FINDINGS[verdict]
            part = f"{n} {one if n == 1 else several}"
            parts.append(f"**{part}**" if verdict == REGRESSION else part)
    present = f"{len(changes)} group{'s' if len(changes) > 1 else ''} present in both runs"
    text = f"{present}: " + ", ".join(parts) + "."
    if any(c.ratios[m].note == ONE_REPEAT for c in changes for m in c.untested):
        text += (
            " With one repeat in either run no test can judge a change: rerun both with `--repeats 3` "
            "or more to judge them."
        )
    return text


def _different_hosts_findings(changes: Sequence[BaselineChange]) -> str:
    present = f"{len(changes)} group{'s' if len(changes) != 1 else ''} present in both runs"
    return f"{present}; {DIFFERENT_HOST}: their absolute changes are shown, not judged."


def _ratios_side_by_side(run: Run, baseline: Run) -> list[Block]:
    """Each comparison between targets that both runs made, its ratios then and now."""
    then = {_comparison_key(c): c for c in compare_groups(baseline.groups)}
    rows = []
    for now in compare_groups(run.groups):
        before = then.get(_comparison_key(now))
        if before is None:
            continue
        cells = []
        for metric in ("rps", "cpu_per_1k"):
            cells += [_ratio(before.ratios.get(metric)), _ratio(now.ratios.get(metric))]
        rows.append([now.kind, f"`{now.candidate.id}` / `{now.baseline.id}`", *cells])
    if not rows:
        return [Paragraph("No comparison between targets was made in both runs.")]
    rps, cpu = METRICS["rps"].label, METRICS["cpu_per_1k"].label
    headers = ("comparison", "groups", f"{rps} then", f"{rps} now", f"{cpu} then", f"{cpu} now")
    return [
        Heading(3, "Ratios between targets, then and now"),
        Paragraph(
            f"Candidate / baseline target within each run, with its Welch {CONFIDENCE:.0%} interval: "
            "a ratio holds the host fixed, so these are comparable across the two hosts."
        ),
        table(headers, rows, (False, False, True, True, True, True)),
    ]


def _methods_differ(now: int, then: int, name: str) -> str:
    """The first thing said when two runs were measured by different methods."""
    changed = "; ".join(f"v{c.version}: {c.changed}" for c in methodology.between(now, then))
    kept = methodology.still_compare(now, then, frozenset(METRICS))
    labels = ", ".join(METRICS[m].label for m in METRICS if m in kept) or "none"
    return (
        f"**Measured by different methods**: this run by methodology v{now}, {name} by v{then} "
        f"({changed}). Still compared: {labels}; every other figure is left out of the verdicts."
    )


def _comparable(changes: Sequence[BaselineChange], now: int, then: int) -> list[BaselineChange]:
    """The changes with only the ratios whose metric means the same under both methods."""
    kept = methodology.still_compare(now, then, frozenset(METRICS))
    return [
        replace(
            c,
            comparison=replace(
                c.comparison, ratios={m: r for m, r in c.comparison.ratios.items() if m in kept}
            ),
        )
        if c.comparison is not None
        else c
        for c in changes
    ]


def _comparison_key(c: Comparison) -> tuple[str, str, str]:
    return c.kind, c.candidate.id, c.baseline.id


def _ratio(r: Ratio | None) -> str:
    if r is None:
        return "-"
    return f"{r.estimate:.2f}x" + ("" if r.significant is None else f" [{r.low:.2f}, {r.high:.2f}]")


def _baseline_cell(r: Ratio | None) -> str:
    """A ratio against the baseline with its change in percent, and its interval where tested."""
    if r is None:
        return "-"
    text = f"{r.estimate:.2f}x ({_percent(r.estimate)})"
    if r.significant is None:
        return text
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    return f"**{text}** {interval} significant" if r.significant else f"{text} {interval} not significant"


def _verdict_cell(c: BaselineChange) -> str:
    if c.comparison is None:
        return (
            f"not compared: no successful repeat in {'this run' if not c.current.results else 'the baseline'}"
        )
    if not c.ratios:
        return "not compared: no metric has values in both runs"
    parts = []
    if c.worse:
        parts.append(f"**{REGRESSION}** ({_labels(c.worse)})")
    if c.better:
        parts.append(f"{IMPROVEMENT} ({_labels(c.better)})")
    untested = c.untested
    for note in sorted({c.ratios[m].note for m in untested}):
        if note == ONE_REPEAT:
            parts.append("one repeat: cannot judge")
        else:
            parts.append(
                f"cannot judge {_labels([m for m in untested if c.ratios[m].note == note])} ({note})"
            )
    if not parts:
        parts.append(WITHIN_NOISE)
    for large, how in (
        ([m for m in c.large if m in untested], "not tested"),
        ([m for m in c.large if m not in untested], "not significant"),
    ):
        if large:
            moves = ", ".join(f"{_percent(c.ratios[m].estimate)} {METRICS[m].label}" for m in large)
            parts.append(f"**large change ({moves}), {how}**")
    return "; ".join(parts)


def _labels(metrics: Sequence[str]) -> str:
    return ", ".join(METRICS[m].label for m in metrics)


def _percent(estimate: float) -> str:
    """The change a ratio stands for: 0.6 -> -40%, 1.09 -> +9%."""
    return f"{estimate - 1:+.0%}"


def _centre(g: Group, metric: str) -> str:
    s = g.summary(metric)
    return fmt(s.centre if s else None, metric_format(metric))


SECTION = Section(TITLE, applies, blocks)
