"""Running a plan: the runner, verification before measuring, k6 invocations, capacity search."""
