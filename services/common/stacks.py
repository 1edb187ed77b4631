"""The server stacks, each declared once: what the services, the runner and the report know of one.

services.common.config takes the default ports from here, labrunner.certs the certificate's names,
labrunner.results.provenance the libraries a manifest records, the payload charts the markers and
the matrix (labrunner.model.schema) which protocols a stack's targets may speak. What cannot read
a Python module (docker-compose.yml, matrix.toml, pyproject.toml's import-linter contracts, the
folders under services/ and benchmarks/floor/) is checked against it by tests/unit/test_stacks.py,
which names what a stack lacks. Adding one: docs/architecture.md, "Adding a server stack".
"""

from dataclasses import dataclass
from typing import Literal

Protocol = Literal["http1.1", "http2", "http3", "grpc"]  # matrix.toml's target protocols


@dataclass(frozen=True)
class Stack:
    """One server stack: services/<package>/, its floor benchmarks/floor/<package>.py and its compose
    service, whose name is also the certificate's DNS name for it."""

    package: str  # python -m services.<package>; matrix.toml targets name it as `service`
    port: int  # PORT when unset; docker-compose.yml builds its image with the same
    metrics_port: int  # METRICS_PORT when unset
    protocols: tuple[Protocol, ...]  # what its targets speak (with or without TLS)
    # The distributions whose versions change what it measures, its server first; every manifest
    # records them (the shared ones, protobuf and the like, are provenance's own).
    distributions: tuple[str, ...]
    marker: str  # its matplotlib marker on the payload charts, where colour is the protocol family

    @property
    def compose_name(self) -> str:
        """Its docker-compose.yml service and the certificate's DNS name: rest_aiohttp -> rest-aiohttp."""
        return self.package.replace("_", "-")

    @property
    def floor_module(self) -> str:
        """Its bare floor server, the `module` of its floor-* target in matrix.toml."""
        return f"benchmarks.floor.{self.package}"


STACKS = (
    Stack("rest_aiohttp", 8081, 9101, ("http1.1",), ("aiohttp",), "o"),
    Stack(
        "rest_quart", 8082, 9102, ("http1.1", "http2", "http3"), ("hypercorn", "quart", "h2", "aioquic"), "s"
    ),
    Stack("grpc_aio", 50051, 9103, ("grpc",), ("grpcio",), "D"),
    # Second implementations at equal protocol: Granian running the Quart app, grpclib.
    Stack("rest_granian", 8083, 9104, ("http1.1", "http2"), ("granian", "quart"), "^"),
    Stack("grpc_grpclib", 50052, 9105, ("grpc",), ("grpclib", "h2"), "v"),
)
BY_PACKAGE = {stack.package: stack for stack in STACKS}
