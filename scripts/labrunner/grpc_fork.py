"""gRPC without fork handlers, for a process that forks children which exec at once."""

import os
import sys


def disable_fork_handlers() -> None:
    """Turn gRPC's fork handlers off; call before anything imports grpc.

    The runner talks gRPC (verification) and forks k6 and the services with a preexec_fn.
    gRPC's fork handlers shut down the sockets of channels still open at fork time, in the
    parent too; a child that execs at once needs none of them. gRPC reads the setting when
    it initialises, so it is too late once grpc is imported.
    """
    if "grpc" in sys.modules:
        raise RuntimeError("disable_fork_handlers() must run before grpc is imported")
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
