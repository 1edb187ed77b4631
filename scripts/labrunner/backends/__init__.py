"""Where a scenario's service and k6 run: local processes in cgroups, or Docker containers."""
