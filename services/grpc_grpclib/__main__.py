"""Run the grpclib service: python -m services.grpc_grpclib (settings from env, see docs/CONTRACTS.md)."""

from services.common.multiprocess import prepare_multiprocess_dir

# prometheus_client chooses multiprocess storage when first imported, so the directory
# must be ready before the imports below pull it in.
prepare_multiprocess_dir()

from services.common.config import load_settings  # noqa: E402
from services.common.supervisor import main_guard, run_service  # noqa: E402
from services.grpc_grpclib.server import worker_main  # noqa: E402


def main() -> int:
    return run_service("grpc_grpclib", "grpclib", load_settings("grpc_grpclib"), worker_main)


if __name__ == "__main__":
    main_guard(main)
