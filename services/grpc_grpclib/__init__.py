"""The gRPC service on grpclib (pure-Python gRPC on h2), one server per forked worker sharing the port."""
