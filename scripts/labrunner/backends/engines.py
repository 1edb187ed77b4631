"""Connect to the Docker engine a role names (labrunner.model.engine_roles): `local`, a context, or a URL."""

import os
from dataclasses import dataclass

import docker
from docker.context import ContextAPI
from docker.errors import DockerException
from requests.exceptions import RequestException, Timeout

from labrunner.backends.base import BackendUnavailable
from labrunner.model.engine_roles import LOCAL_ENGINE

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


class EngineSilent(BackendUnavailable):
    """The engine a role names did not answer; `why` says so in a few words, not as a traceback."""

    def __init__(self, role: str, name: str, url: str, why: str) -> None:
        where = name if name == url else f"{name} ({url})"
        super().__init__(f"{role} engine {where} did not answer: {why}")
        self.url, self.why = url, why


@dataclass(frozen=True)
class Engine:
    """One engine a run uses: how the user named it, where it is, and a client of it."""

    name: str  # as given: `local`, a context name or a URL
    url: str  # the address the client speaks to (unix://, tcp://, ssh://)
    client: docker.DockerClient

    @property
    def on_this_host(self) -> bool:
        """A unix socket is this machine's engine, so its CPUs are the ones /proc/stat shows."""
        return self.url.startswith("unix://")

    def describe(self, role: str) -> str:
        return f"{role} engine {self.name}" + ("" if self.name == self.url else f" ({self.url})")


def connect(name: str, role: str, timeout_s: int) -> Engine:
    """A client of the named engine that answered a ping; BackendUnavailable naming it otherwise."""
    url = name
    try:
        if name == LOCAL_ENGINE:
            url = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
            client = docker.from_env(timeout=timeout_s)
        elif "://" in name:
            # from_env reads TLS for a tcp:// URL from DOCKER_TLS_VERIFY and DOCKER_CERT_PATH.
            environment = {**os.environ, "DOCKER_HOST": name}
            client = docker.from_env(
                environment=environment, timeout=timeout_s, use_ssh_client=name.startswith("ssh://")
            )
        else:
            context = ContextAPI.get_context(name)
            if context is None or not context.Host:
                raise BackendUnavailable(
                    f"{role} engine {name}: no Docker context of that name (see `docker context ls`); "
                    "name an engine as 'local', a context or a URL (unix://, tcp://, ssh://)"
                )
            url = context.Host.replace("http+unix://", "unix://", 1)  # as the SDK stores a socket
            client = docker.DockerClient(
                base_url=url,
                tls=context.TLSConfig or False,
                timeout=timeout_s,
                use_ssh_client=url.startswith("ssh://"),
            )
        client.ping()
    except (DockerException, RequestException, OSError) as exc:
        raise EngineSilent(role, name, url, silence(exc, timeout_s)) from exc
    return Engine(name, url, client)


def silence(exc: BaseException, timeout_s: float) -> str:
    """Why an engine did not answer, in words. The SDK wraps the socket's error two or three times
    ("Error while fetching server API version: ('Connection aborted.', FileNotFoundError(2, ...))")."""
    cause: BaseException | None = exc
    innermost = exc
    while cause is not None:
        match cause:
            case FileNotFoundError():
                return "no socket at that path"
            case PermissionError():
                return "permission denied on its socket (is this user in the docker group?)"
            case ConnectionRefusedError():
                return "connection refused"
            case TimeoutError() | Timeout():
                return f"no answer within {timeout_s:g} s"
        innermost, cause = cause, cause.__cause__ or cause.__context__
    return str(innermost) or type(innermost).__name__
