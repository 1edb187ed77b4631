"""TLS handshake benchmark: each Python-TLS server's CPU per connection, full handshake against resumed;
`--help` for options."""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from labrunner.files import write_json_atomic
from labrunner.report import handshakes
from labrunner.report.handshakes import HandshakeCase


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="handshake_bench.py",
        description="Start each server whose TLS handshakes are counted (aiohttp, Quart on Hypercorn, "
        "grpclib) with TLS and one worker, and measure its worker's CPU per connection: full handshakes, "
        "resumed ones (the previous connection's session offered) and connections closed before any "
        "handshake, in microseconds, with 95%% intervals over the rounds. The servers' own handshake "
        "counters must equal the plan. About 25 s with the defaults.",
    )
    parser.add_argument(
        "--rounds", type=_positive, default=handshakes.ROUNDS, help="rounds per server (default %(default)s)"
    )
    parser.add_argument(
        "--handshakes",
        type=_positive,
        default=handshakes.HANDSHAKES,
        help="connections per phase and round (default %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help=f"also write the JSON, e.g. results/<run>/{handshakes.FILE}"
    )
    args = parser.parse_args(argv)
    try:
        cases = handshakes.run(args.rounds, args.handshakes, say=print)
    except (handshakes.HandshakeMismatch, handshakes.BenchError) as error:
        print(f"handshake benchmark failed: {error}", file=sys.stderr)
        return 1
    document = handshakes.as_document(cases)
    if args.out:
        write_json_atomic(args.out, document)
    print(table(handshakes.cases_of(document)))
    print(f"{document['python']}, {document['openssl']}")
    return 0


def table(cases: Sequence[HandshakeCase]) -> str:
    """server, TLS, full µs [interval], resumed µs [interval], resumed/full [interval], no handshake µs,
    the server's counts, and the share of the host's CPUs others used meanwhile."""
    rows = [
        (
            "server",
            "TLS",
            "full µs [95%]",
            "resumed µs [95%]",
            "resumed/full [95%]",
            "no hs µs",
            "counted",
            "others",
        )
    ]
    for case in cases:
        rows.append(
            (
                case.service,
                case.tls_version,
                case.full_us.text("{:.0f}"),
                case.resumed_us.text("{:.0f}"),
                case.resumed_over_full.text("{:.3f}"),
                f"{case.no_handshake_us.value:.0f}",
                f"{case.counted_full} full, {case.counted_resumed} resumed",
                f"{case.others_share:.0%}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    if cases:
        first = cases[0]
        pinned = f"server on CPU {first.server_cpu}, client on CPU {first.client_cpu}"
        plan = (
            f"{first.rounds} rounds of {first.handshakes} connections per phase after {first.warmup} of each"
        )
        lines.append(
            f"{plan}; {pinned if first.server_cpu is not None else 'not pinned (one CPU available)'}"
        )
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
