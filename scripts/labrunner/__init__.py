"""protolab's orchestration package: the scenario matrix, the runner, its backends, results and report."""
