"""`protolab` and `python -m labrunner`: run the scenario matrix (run_matrix.py's options)."""

import sys
from collections.abc import Sequence

from labrunner import grpc_fork, paths


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if paths.CHECKOUT is None:
        # The runner reads the checkout's matrix, k6 scripts and configs (some at import): without
        # one, only the version answers.
        if args == ["--version"]:
            print(f"protolab {paths.release()} (no protolab checkout found)")
            return 0
        sys.exit(paths.no_checkout())
    grpc_fork.disable_fork_handlers()
    try:
        # Imported only now: the runner's modules import grpc, which reads the setting above.
        from labrunner.cli import run_matrix  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("services.common.pb"):
            raise
        sys.exit(
            f"protolab: the gRPC stubs are missing ({exc.name}): generate them in the checkout "
            "(scripts/setup.sh, or python scripts/gen_proto.py), then reinstall if protolab was "
            "installed with `pip install <clone>`"
        )
    return run_matrix.main(args)


if __name__ == "__main__":
    sys.exit(main())
