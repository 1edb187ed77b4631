"""`protolab` and `python -m labrunner`: run the scenario matrix (run_matrix.py's options)."""

import sys
from collections.abc import Sequence

from labrunner import grpc_fork


def main(argv: Sequence[str] | None = None) -> int:
    grpc_fork.disable_fork_handlers()
    try:
        # Imported only now: the runner's modules import grpc, which reads the setting above.
        from labrunner.cli import run_matrix  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("services.common.pb"):
            raise
        sys.exit(f"protolab: the gRPC stubs are missing ({exc.name}); run: python scripts/gen_proto.py")
    return run_matrix.main(argv)


if __name__ == "__main__":
    sys.exit(main())
