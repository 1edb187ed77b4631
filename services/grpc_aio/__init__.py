"""The gRPC service: grpc.aio on uvloop, one server per forked worker sharing the port."""
