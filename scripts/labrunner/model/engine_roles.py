"""Which Docker engine runs each role: the service under test on one, k6's instances on one or more.

Set in matrix.toml's [hosts] table or with --service-engine, --load-engine and --publish-address.
An engine is named as the Docker CLI names it:
- `local`: the engine at DOCKER_HOST, else the default socket (what the docker backend always used);
- a Docker context (`docker context ls`), which carries its own address and TLS material;
- a DOCKER_HOST URL: unix://, tcp:// (TLS from DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as the
  Docker CLI reads them) or ssh://.
"""

import ipaddress
import re
from dataclasses import dataclass

LOCAL_ENGINE = "local"
LOOPBACK_ADDRESS = "127.0.0.1"
URL_SCHEMES = ("unix", "tcp", "ssh")
_CONTEXT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # the Docker CLI's rule for context names


class HostsError(ValueError):
    """An engine or publish address that cannot be used; the message names the key or option."""


@dataclass(frozen=True)
class Hosts:
    """The engines of the two roles and the address the service is published on."""

    service: str = LOCAL_ENGINE
    load: tuple[str, ...] = (LOCAL_ENGINE,)
    # Where the service's ports are published on its engine's host, and the address k6 on another
    # engine dials. The server certificate must name it (PUBLISH_ADDRESS for compose's `certs`).
    publish_address: str = LOOPBACK_ADDRESS

    @property
    def default(self) -> bool:
        return self == Hosts()


def check_engine(value: str, where: str) -> str:
    """`local`, a context name or a URL with a scheme the Docker SDK speaks; else HostsError."""
    if value == LOCAL_ENGINE or _CONTEXT_NAME.match(value):
        return value
    scheme, separator, rest = value.partition("://")
    if separator and scheme in URL_SCHEMES and rest:
        return value
    raise HostsError(
        f"{where}: {value!r} is not an engine: use 'local', a Docker context name, or a URL "
        f"({', '.join(s + '://' for s in URL_SCHEMES)})"
    )


def check_publish_address(value: str, where: str) -> str:
    """An IPv4 address of the service engine's host: Docker publishes ports on an address, not a
    name, and the certificate and k6's URLs carry it as it is."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise HostsError(f"{where}: {value!r} is not an IPv4 address") from None
    if address.version != 4 or address.is_unspecified:
        raise HostsError(
            f"{where}: {value!r}: give the IPv4 address other hosts dial (not 0.0.0.0; IPv6 not yet)"
        )
    return value


def hosts(service: str, load: tuple[str, ...], publish_address: str, where: str) -> Hosts:
    """Validated Hosts; `where` names the table or options in errors."""
    if not load:
        raise HostsError(f"{where}: load must name at least one engine")
    if len(set(load)) != len(load):
        raise HostsError(f"{where}: load names an engine twice: {', '.join(load)}")
    return Hosts(
        service=check_engine(service, f"{where} service"),
        load=tuple(check_engine(engine, f"{where} load") for engine in load),
        publish_address=check_publish_address(publish_address, f"{where} publish_address"),
    )
