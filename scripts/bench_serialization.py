"""Serialization micro-benchmark (orjson, stdlib json, protobuf; encode and decode); `--help` for options."""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from labrunner.files import write_json_atomic
from labrunner.report import serialization


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_serialization.py",
        description="Time encoding and decoding of a response of N pool records with orjson, the standard "
        "library's json and protobuf, in BenchmarkDotNet's columns (microseconds per operation).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer counts and shorter iterations (about 1 s; for CI)"
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="also write the JSON, e.g. results/<run>/serialization.json"
    )
    args = parser.parse_args(argv)
    budget = serialization.QUICK if args.quick else serialization.FULL
    document = serialization.as_document(serialization.run(budget), budget)
    if args.out:
        write_json_atomic(args.out, document)
    print(_table(document))
    return 0


def _table(document: dict[str, object]) -> str:
    header = f"{'codec':9} {'operation':9} {'records':>7} {'bytes':>7} {'geomean us':>10} {'95% CI':>19}"
    lines = [header]
    for case in serialization.cases_from_document(document):
        interval = f"[{_number(case.low_us)}, {_number(case.high_us)}]"
        lines.append(
            f"{case.codec:9} {case.operation:9} {case.count:7d} {case.bytes:7d} {case.geomean_us:10.2f} "
            f"{interval:>19}"
        )
    return "\n".join(lines) + "\n" + json.dumps({k: document[k] for k in ("python", "protobuf_backend")})


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
