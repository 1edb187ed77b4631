"""Run Quart on Granian: python -m services.rest_granian (settings from env, see docs/CONTRACTS.md)."""

from services.common.multiprocess import prepare_multiprocess_dir

# prometheus_client chooses multiprocess storage when first imported, so the directory
# must be ready before the imports below pull it in.
prepare_multiprocess_dir()

from services.common.config import load_settings  # noqa: E402
from services.common.supervisor import main_guard, run_service  # noqa: E402
from services.rest_granian.server import worker_main  # noqa: E402


def main() -> int:
    return run_service("rest_granian", "granian", load_settings("rest_granian"), worker_main)


if __name__ == "__main__":
    main_guard(main)
