"""The answers first: the findings' chart, each question's lines and their notes, the method, the
run's host and date, and a warning when the host changed speed during the run."""

from collections.abc import Callable, Sequence

from labrunner.model.scenario import DEFAULT_SHAPE, DEFAULT_STREAMS, IDENTITY, UPLOAD, churn_words
from labrunner.report import aa_control, host_conditions
from labrunner.report import charts as drawing
from labrunner.report.compare import AA_CONTROL, Comparison, Group
from labrunner.report.document import Block, Heading, Image, Paragraph
from labrunner.report.findings import for_run, text
from labrunner.report.findings.finding import corrected
from labrunner.report.findings.pairs import saturation_comparisons, side_names
from labrunner.report.floor import lab_groups
from labrunner.report.sections.section import Report, Section, always
from labrunner.report.stats import Ratio

TITLE = "Findings"


def blocks(report: Report) -> list[Block]:
    """The findings' chart, each question's lines and their notes, then the method, the run's host and
    date, and the calibration's warning."""
    run = report.run
    m = run.manifest
    host, preset = m.get("host", {}), m.get("matrix", {}).get("preset")
    on = (
        f"Run {run.run_id} on {host.get('cpu_model') or 'an unrecorded host'} "
        f"({host.get('cpus_available', '?')} of {host.get('cpu_count', '?')} CPUs available), "
        f"started {m.get('started_at') or 'at an unrecorded time'}, preset `{preset}`; provenance at the end."
    )
    found = for_run(run.groups, preset, cases=report.cases, handshake_cases=report.handshakes)
    shown: list[Block] = [Heading(2, TITLE)]
    if chart := drawing.forest(forest_rows(run.groups), report.charts_dir / "findings.png"):
        shown.append(
            Image(chart, "the findings' ratios", "req/s ratios of the compared pairs, A/A control first")
        )
    shown += text.blocks(found)
    if not found:
        shown.append(Paragraph(text.NONE_YET.removeprefix("- ")))
    shown += [Paragraph(f"{text.CONFIDENCE_LINE} {text.LEGEND}"), Paragraph(on)]
    return shown + host_conditions.calibration_warnings(m)


def forest_rows(groups: Sequence[Group]) -> list[tuple[str, Ratio]]:
    """The req/s ratio of each duet's A/A control and of each pair the findings compare, labelled;
    a pair's significance is the findings' own, after Holm's correction over the run's req/s tests
    (findings.pairs), so the chart and the lines agree. Where the pairs differ in records, direction,
    shape, profile, load model or connection model, each label says its own:
    "grpc / aiohttp-h1 (c100, uploads, numeric)"."""
    lab = lab_groups(groups)
    pairs = [c for _, c in saturation_comparisons(lab)]
    judged = corrected([r for c in pairs if (r := c.ratios.get("rps")) is not None and r.p_value is not None])
    comparisons = [*aa_control.controls(lab), *pairs]
    varying = [
        show
        for attribute, show in _CONDITIONS
        if len({getattr(c.candidate, attribute) for c in comparisons}) > 1
    ]

    def label(c: Comparison) -> str:
        pair = (
            f"A/A {c.candidate.target}"
            if c.kind == AA_CONTROL
            else " / ".join(side_names(c.candidate, c.baseline))
        )
        # A condition the names already say (two connection models) is not said again.
        shown = [part for show in varying if (part := show(c.candidate)) and part not in pair]
        return f"{pair} ({', '.join(shown)})" if shown else pair

    return [(label(c), judged.get(id(r), r)) for c in comparisons if (r := c.ratios.get("rps")) is not None]


# (a group's attribute, how a forest label shows it, "" for nothing): what can tell two rows of the same
# targets apart.
_CONDITIONS: tuple[tuple[str, Callable[[Group], str]], ...] = (
    ("count", lambda g: f"c{g.count}"),
    ("direction", lambda g: "uploads" if g.direction == UPLOAD else ""),
    ("shape", lambda g: "" if g.shape == DEFAULT_SHAPE else g.shape),
    ("profile", lambda g: g.profile),
    ("load_model", lambda g: g.load_model),
    ("connection_model", lambda g: "" if g.streams == DEFAULT_STREAMS else g.connection_model),
    ("churn", lambda g: "" if g.churn is None else churn_words(g.churn)),
    ("compression", lambda g: "" if g.compression == IDENTITY else g.compression),
)


SECTION = Section(TITLE, always, blocks)
