"""Where a scenario's service and k6 run, picked by name; a backend's module is imported only when used.

Each backend module offers `probe() -> str` (why it can run here; BackendUnavailable if it
cannot) and `create(settings, say) -> Backend`. So a local run never imports the docker SDK.
"""

import importlib
from types import ModuleType

from labrunner.backends.base import Backend, BackendSettings, BackendUnavailable
from labrunner.say import Say

_MODULES = {"docker": "labrunner.backends.docker_backend", "local": "labrunner.backends.local"}
NAMES = tuple(_MODULES)
# `auto` takes the first backend that can run here: the users' default first.
AUTO_ORDER = ("docker", "local")


def choose(requested: str) -> tuple[str, str]:
    """The backend to use and why: `auto` takes docker when the lab's engine is ready, else local."""
    if requested != "auto":
        return requested, "requested"
    unavailable: list[str] = []
    for name in AUTO_ORDER:
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
    if name not in _MODULES:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from {', '.join(NAMES)})")
    return importlib.import_module(_MODULES[name])
