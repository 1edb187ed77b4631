"""Run the protolab scenario matrix (matrix.toml); `--help` documents every option."""

import sys
from pathlib import Path

# The services package and its generated gRPC stubs live at the repository root.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

try:
    from labrunner.cli import main
except ModuleNotFoundError as exc:
    if not (exc.name or "").startswith("services.common.pb"):
        raise
    sys.exit(f"run_matrix.py: the gRPC stubs are missing ({exc.name}); run: python scripts/gen_proto.py")

if __name__ == "__main__":
    sys.exit(main())
