"""CLI: start, stop or show the local Prometheus and InfluxDB used by the local backend."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from labrunner.observe import influx_auth, local_stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument(
        "--dir",
        type=Path,
        default=local_stack.LAB_DIR,
        help="state, data and logs (default: <repo>/.lab/obs)",
    )
    parser.add_argument(
        "--targets-dir",
        type=Path,
        default=local_stack.DEFAULT_TARGETS_DIR,
        help="where Prometheus reads file_sd JSON (default: <repo>/prometheus/targets)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            # InfluxDB with auth when .env has its three passwords (scripts/setup.sh), as compose's.
            users = influx_auth.users()
            for name, url in local_stack.start(args.dir, args.targets_dir, users=users).items():
                print(f"{name}: {url}")
        elif args.command == "stop":
            local_stack.stop(args.dir)
            print("stopped")
        else:
            print(json.dumps(local_stack.status(args.dir), indent=2))
    except local_stack.ObservabilityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
