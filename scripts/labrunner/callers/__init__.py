"""The lab's Python callers (preset caller, docs/caller.md): one process per call of one client library,
run by labrunner.run.callers in a cgroup of its own. The lowest layer: like a service, a caller imports
no layer of the runner, only services.common."""
