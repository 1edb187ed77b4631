"""protolab systems under test: one data contract over REST and gRPC."""
