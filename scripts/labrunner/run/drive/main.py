"""The Python driver's command line: the k6 options the runner passes (run/k6/invocation.py,
run/k6/segments.py) and the environment rest.js reads, so that a target whose script is
scripts/drive_http.py runs where k6 would, and its summary is read as k6's is."""

import argparse
import os
import sys
from fractions import Fraction
from pathlib import Path

import uvloop

from labrunner.run.drive import clients, load, summary
from labrunner.run.drive.connection import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S

EXIT_THRESHOLDS_CROSSED = 99  # k6's: the run completed, a threshold failed
EXIT_BAD_SETUP = 107  # k6's for a script that throws in its init: nothing was sent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drive_http.py",
        description="Load an HTTP/1.1, HTTP/2 or HTTP/3 server as a k6 VU would (docs/http3.md): "
        "the environment of k6/rest.js, a subset of `k6 run`'s options.",
    )
    parser.add_argument("--quiet", action="store_true", help="accepted, as k6's")
    parser.add_argument("--no-color", action="store_true", help="accepted, as k6's")
    parser.add_argument("--address", default="", help="accepted; the driver serves no API")
    parser.add_argument("--summary-trend-stats", default="avg,min,med,max,p(90),p(95),p(99)")
    parser.add_argument("--tag", action="append", default=[], help="accepted; the driver writes no points")
    parser.add_argument("--out", action="append", default=[], help="csv=FILE: every sample of the clock")
    parser.add_argument("--execution-segment", default="0:1", help="this process's part of the load")
    parser.add_argument("--execution-segment-sequence", default="", help="accepted, as k6's")
    return parser


def _segment(text: str) -> tuple[Fraction, Fraction]:
    start, _, end = text.partition(":")
    return Fraction(start or "0"), Fraction(end or "1")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    csv_files = [Path(out.removeprefix("csv=")) for out in args.out if out.startswith("csv=")]
    try:
        plan = load.plan_from(os.environ, _segment(args.execution_segment))
        open_connection = clients.opener(
            plan.protocol, plan.base_url, Path(plan.ca_file) if plan.ca_file else None
        )
    except ValueError as exc:
        print(f"drive_http: {exc}", file=sys.stderr)
        return EXIT_BAD_SETUP
    try:
        tally, ran_s = uvloop.run(load.run(plan, open_connection))
    except (OSError, ConnectionError, TimeoutError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TimeoutError) and not str(exc):  # asyncio's and aiohttp's say nothing
            why += f"no answer in time ({CONNECT_TIMEOUT_S:g} s to connect, {REQUEST_TIMEOUT_S:g} s to reply)"
        print(f"drive_http: could not connect {plan.vus} VUs to {plan.base_url}: {why}", file=sys.stderr)
        return EXIT_BAD_SETUP
    document = summary.document(tally, ran_s, args.summary_trend_stats.split(","))
    if summary_file := os.environ.get("SUMMARY_FILE"):
        summary.write_summary(Path(summary_file), document)
    for path in csv_files:
        summary.write_csv(path, tally.latency_ms)
    if tally.first_failure:
        print(f"drive_http: first failure: {tally.first_failure}", file=sys.stderr)
    print(summary.line(document))
    return 0 if summary.thresholds_ok(document) else EXIT_THRESHOLDS_CROSSED


if __name__ == "__main__":
    sys.exit(main())
