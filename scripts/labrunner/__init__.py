"""Orchestration package behind scripts/run_matrix.py and scripts/local_obs.py."""

import os

# The runner talks gRPC (verification) and forks k6 and the services with a preexec_fn.
# gRPC's fork handlers shut down the sockets of channels still open at fork time, in the
# parent too; a child that execs at once needs none of them, so gRPC runs without them.
# Read when gRPC initialises, so it is set here, before any labrunner module imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
