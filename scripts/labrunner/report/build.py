"""The run report: results/<run>/report.md and report.html, built from the run's saved JSON."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labrunner.files import write_text_atomic
from labrunner.report import (
    appendix,
    floor,
    host_conditions,
    latency_curve,
    payload,
    payload_sweep,
    sections,
    serialization,
)
from labrunner.report import baseline as baseline_section
from labrunner.report import network as network_figures
from labrunner.report.compare import against_baseline
from labrunner.report.document import Block, Heading, to_html, to_markdown
from labrunner.report.runs import Run, load_run, read_json

PAYLOAD_FILE = "payload.json"
SERIALIZATION_FILE = serialization.FILE
CHARTS_DIR = "charts"


def write_report(run_dir: Path, baseline_dir: Path | None = None) -> tuple[Path, Path]:
    """Regenerate report.md, report.html and charts/ from the run's JSON files."""
    run = load_run(run_dir)
    baseline = load_run(baseline_dir) if baseline_dir is not None else None
    payload_rows = payload.rows_from_document(read_json(run_dir / PAYLOAD_FILE))
    payload_note = ""
    if not payload_rows:
        payload_rows = payload.measure()
        payload_note = f"{PAYLOAD_FILE} was missing: computed now from the current code's record pool."
    bench = read_json(run_dir / SERIALIZATION_FILE)
    for stale in (run_dir / CHARTS_DIR).glob("*.png"):  # a chart without data this time must not linger
        stale.unlink()
    blocks = build(run, baseline, payload_rows, payload_note, bench)
    title = f"protolab report: run {run.run_id}"
    md, page = run_dir / "report.md", run_dir / "report.html"
    write_text_atomic(md, to_markdown(blocks, run_dir))
    write_text_atomic(page, to_html(blocks, title))
    return md, page


def build(
    run: Run,
    baseline: Run | None,
    payload_rows: Sequence[payload.PayloadRow],
    payload_note: str,
    bench: Any,
) -> list[Block]:
    """Every section of the report, in reading order."""
    charts_dir = run.path / CHARTS_DIR
    changes = against_baseline(run.groups, baseline.groups) if baseline else {}
    blocks: list[Block] = [Heading(1, f"protolab report: run {run.run_id}")]
    blocks += sections.findings(run)
    blocks += host_conditions.calibration_warnings(run.manifest)
    blocks += sections.summary(run, changes, baseline)
    blocks += sections.latency(run)
    blocks += latency_curve.section(run.groups, run.manifest)  # with two offered rates or a rung not run
    blocks += sections.sequential(run)
    blocks += sections.capacity(run)
    blocks += sections.comparisons(run)
    blocks += floor.section(run.groups)  # only with floor-* targets
    blocks += network_figures.section(run.groups)  # only with more than one network profile
    cases = serialization.cases_from_document(bench)
    blocks += payload_sweep.section(run.groups, payload_rows, cases)  # only with two or more counts
    blocks += host_conditions.section(run.manifest, run.results)
    if baseline is not None:
        blocks += baseline_section.section(run, baseline)
    blocks += appendix.charts_section(run, payload_rows, cases, charts_dir)
    blocks += appendix.payload_section(payload_rows, payload_note)
    blocks += appendix.serialization_section(bench)
    blocks += sections.problems(run)
    blocks += sections.provenance(run)
    return blocks
