"""Generate protolab's Grafana dashboards (provisioned and hand-import variants); --check reports drift."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_dashboards.importable import importable
from grafana_dashboards.k6_client import k6_grpc, k6_http
from grafana_dashboards.matrix import matrix
from grafana_dashboards.queries import Json
from grafana_dashboards.server import grpc_server, service

REPO = Path(__file__).resolve().parent.parent
GRAFANA_DIR = REPO / "grafana"
# Provisioned by grafana/provisioning/dashboards/dashboards.yml (mounted at /var/lib/grafana/dashboards).
DASHBOARDS_DIR = GRAFANA_DIR / "dashboards"
# Outside DASHBOARDS_DIR: Grafana's file provider reads its folder recursively.
IMPORT_DIR = GRAFANA_DIR / "import"

# Each dashboard by the name of its file, in grafana/dashboards/ and grafana/import/.
DASHBOARDS: dict[str, Callable[[], Json]] = {
    "k6-http": k6_http,
    "k6-grpc": k6_grpc,
    "service": service,
    "grpc-server": grpc_server,
    "matrix": matrix,
}


def render(data: Json) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def expected_files(grafana_dir: Path = GRAFANA_DIR) -> dict[Path, str]:
    """Every file the generator writes under grafana_dir (dashboards/ and import/), with its text."""
    files: dict[Path, str] = {}
    for name, build in DASHBOARDS.items():
        provisioned = build()
        files[grafana_dir / DASHBOARDS_DIR.name / f"{name}.json"] = render(provisioned)
        files[grafana_dir / IMPORT_DIR.name / f"{name}.json"] = render(importable(provisioned))
    return files


def stale_files(expected: dict[Path, str], grafana_dir: Path = GRAFANA_DIR) -> list[Path]:
    """JSON files in the generated folders that the generator no longer writes (a removed dashboard)."""
    folders = (grafana_dir / DASHBOARDS_DIR.name, grafana_dir / IMPORT_DIR.name)
    return sorted(p for d in folders if d.is_dir() for p in d.glob("*.json") if p not in expected)


def _shown(path: Path) -> Path:
    """A path as the messages name it: relative to the repository when inside it."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 listing files that differ"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        default=GRAFANA_DIR,
        help="write dashboards/ and import/ under DIR (default: grafana/)",
    )
    args = parser.parse_args(argv)
    grafana_dir: Path = args.out.resolve()
    expected = expected_files(grafana_dir)
    differing = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    stale = stale_files(expected, grafana_dir)
    if args.check:
        for path in [*differing, *stale]:
            print(f"out of date: {_shown(path)}", file=sys.stderr)
        if differing or stale:
            print("run: python scripts/gen_dashboards.py", file=sys.stderr)
            return 1
        return 0
    for path in differing:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {_shown(path)}")
    for path in stale:
        path.unlink()
        print(f"removed {_shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
