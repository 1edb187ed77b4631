"""The local backend: each service a process in its own cgroup, k6 on the CPUs left over.

The registry (labrunner.backends) needs only `probe` and `create`; LocalBackend is the class they
make, a face over one module per job: service (the service's process: spawned, its listening line,
stopped), k6 (k6's processes), usage (wait4 and cgroup accounting, the measured window), network (a
network scenario's namespaces and emulator), limits (the cgroup and what a child enters before
exec). The cgroup code that stands alone is labrunner.backends.cgroups; namespaces and emulators
are labrunner.network's.
"""

from labrunner.backends.local.backend import LocalBackend, create, probe

__all__ = ["LocalBackend", "create", "probe"]
