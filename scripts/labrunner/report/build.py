"""The run report: results/<run>/report.md and report.html, built from the run's saved JSON."""

from pathlib import Path

from labrunner.files import write_text_atomic
from labrunner.report import handshakes, payload, serialization
from labrunner.report.document import Block, Heading, to_html, to_markdown
from labrunner.report.runs import load_run, read_json
from labrunner.report.sections import SECTIONS
from labrunner.report.sections.section import Report

PAYLOAD_FILE = "payload.json"
SERIALIZATION_FILE = serialization.FILE


def write_report(run_dir: Path, baseline_dir: Path | None = None) -> tuple[Path, Path]:
    """Regenerate report.md, report.html and charts/ from the run's JSON files."""
    run = load_run(run_dir)
    baseline = load_run(baseline_dir) if baseline_dir is not None else None
    payload_rows = payload.rows_from_document(read_json(run_dir / PAYLOAD_FILE))
    payload_note = ""
    if not payload_rows:
        payload_rows = payload.measure()
        payload_note = f"{PAYLOAD_FILE} was missing: computed now from the current code's record pool."
    report = Report(
        run,
        baseline,
        tuple(payload_rows),
        payload_note,
        read_json(run_dir / SERIALIZATION_FILE),
        tuple(handshakes.cases_of(read_json(run_dir / handshakes.FILE))),
    )
    for stale in report.charts_dir.glob("*.png"):  # a chart without data this time must not linger
        stale.unlink()
    blocks = build(report)
    title = f"protolab report: run {run.run_id}"
    md, page = run_dir / "report.md", run_dir / "report.html"
    write_text_atomic(md, to_markdown(blocks, run_dir))
    write_text_atomic(page, to_html(blocks, title))
    return md, page


def build(report: Report) -> list[Block]:
    """Every section that applies to the report, in the registry's (reading) order."""
    blocks: list[Block] = [Heading(1, f"protolab report: run {report.run.run_id}")]
    for section in SECTIONS:
        if section.applies(report):
            blocks += section.blocks(report)
    return blocks
