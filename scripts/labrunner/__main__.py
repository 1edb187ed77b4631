"""`protolab` and `python -m labrunner`: run the scenario matrix (run_matrix.py's options)."""

import sys
from collections.abc import Sequence
from pathlib import Path

from labrunner import grpc_fork, paths


def command_name() -> str:
    """The command the user ran, as --help, --version and errors name it: `protolab`,
    `run_matrix.py` (scripts/run_matrix.py), or `python -m labrunner`."""
    name = Path(sys.argv[0]).name if sys.argv else ""
    return "python -m labrunner" if name == "__main__.py" else name or "protolab"


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    prog = command_name()
    if paths.CHECKOUT is None:
        # The runner reads the checkout's matrix, k6 scripts and configs: without one, only the
        # version and the help answer.
        if args == ["--version"]:
            print(f"{prog} {paths.release()} (no protolab checkout found)")
            return 0
        if args not in (["--help"], ["-h"]):
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
    return run_matrix.main(args, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
