"""The docker backend: each scenario's service a container under its profile's limits, k6 beside it
or on the load engines [hosts] names.

The registry (labrunner.backends) needs only `probe` and `create`; DockerBackend is the class they
make. The rooms behind them: backend (the Backend seam), preflight (engines checked and prepared
before any scenario), services (the service's container), k6 (k6's containers and where they run),
network_helper (tc in the service's namespace), stats (usage from docker stats), archives and certs
(files through the engine's API, the certs volume's CA), containers (made and removed), names
(what docker-compose.yml fixes).
"""

from labrunner.backends.docker.backend import DockerBackend, create, probe

__all__ = ["DockerBackend", "create", "probe"]
