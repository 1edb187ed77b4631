"""Where a scenario's service and k6 run, picked by name; a backend's module is imported only when used.

Each backend is a package named in the matrix's BACKENDS, offering `probe() -> str` (why it can
run here; BackendUnavailable if it cannot) and `create(settings, say) -> Backend`. So a local run
never imports the docker SDK.
"""

import importlib
from types import ModuleType

from labrunner.backends.base import Backend, BackendSettings, BackendUnavailable
from labrunner.model.engine_roles import Hosts
from labrunner.model.scenario import BACKENDS
from labrunner.say import Say

AUTO = "auto"


def choose(requested: str, hosts: Hosts | None = None) -> tuple[str, str]:
    """The backend to use and why, in one sentence: `auto` takes docker when `hosts` ([hosts] or the
    engine options) name Docker engines, or when the lab's engine is ready; else local."""
    if requested != AUTO:
        return requested, "requested"
    if hosts is not None and not hosts.default:
        return "docker", "auto: [hosts] or the engine options name Docker engines"
    unavailable: list[str] = []
    for name in BACKENDS:  # the users' default first
        try:
            why = _module(name).probe()
        except BackendUnavailable as exc:
            unavailable.append(str(exc))
            continue
        return name, "auto: " + "; ".join(unavailable or [why])
    raise BackendUnavailable("auto: no backend can run here: " + "; ".join(unavailable))


def create(name: str, settings: BackendSettings, say: Say = print) -> Backend:
    """The named backend for a run; BackendUnavailable when it cannot run here."""
    backend: Backend = _module(name).create(settings, say)
    return backend


def _module(name: str) -> ModuleType:
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    return importlib.import_module(f"{__name__}.{name}")
