"""Where the lab's files are: the repository this package is installed from (editable, see README)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
