"""Regenerate a run's summaries and report (report.md, report.html, charts/) from its saved JSON;
`--help` for options."""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from labrunner.cli import version
from labrunner.report.build import write_report
from labrunner.report.summary import write_summaries
from labrunner.results.callers import is_caller_run
from labrunner.results.store import ManifestError, checked_manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="report.py",
        description="Write RUN_DIR/report.md and RUN_DIR/report.html (self-contained, charts embedded), "
        "and summary.md/csv (findings first), from RUN_DIR/manifest.json, scenarios/*.json, payload.json "
        "and serialization.json.",
    )
    parser.add_argument("--version", action=version.ShowVersion)
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a run directory, e.g. results/<run id>"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="OTHER_RUN_DIR",
        help="add the change of every scenario group against this run and flag significant regressions",
    )
    parser.add_argument(
        "--server-run",
        type=Path,
        metavar="MAIN_RUN_DIR",
        help="a caller run (preset caller) only: put the same calls' server side from this main run beside "
        "the callers' CPU per call",
    )
    args = parser.parse_args(argv)
    if is_caller_run(args.run_dir):  # preset caller: its own report, no summaries, no baseline
        # Imported for a caller run only.
        from labrunner.report import callers  # noqa: PLC0415

        md, html = callers.write_report(args.run_dir, args.server_run)
        print(f"{md}\n{html}")
        return 0
    for directory in (args.run_dir, args.baseline):
        if directory is not None and not (directory / "scenarios").is_dir():
            print(f"report.py: error: {directory} is not a run directory (no scenarios/)", file=sys.stderr)
            return 2
    try:
        manifest = checked_manifest(args.run_dir)
    except ManifestError as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2
    order = [s["id"] for s in manifest.get("matrix", {}).get("scenarios", [])]
    write_summaries(args.run_dir, manifest.get("run_id", args.run_dir.name), order)
    md, html = write_report(args.run_dir, args.baseline)
    print(f"{args.run_dir / 'summary.md'}\n{md}\n{html}")
    return 0
