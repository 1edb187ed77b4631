"""Run Quart on Hypercorn: python -m services.rest_quart (settings from env, see docs/CONTRACTS.md)."""

from services.common.multiprocess import prepare_multiprocess_dir

# prometheus_client chooses multiprocess storage when first imported, so the directory
# must be ready before the imports below pull it in (Hypercorn's spawned workers inherit
# its path and do not run this module).
prepare_multiprocess_dir()

from services.common.supervisor import main_guard  # noqa: E402
from services.rest_quart.server import main  # noqa: E402

if __name__ == "__main__":
    main_guard(main)
