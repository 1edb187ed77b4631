"""Network profiles (delay, jitter, loss, rate per direction), validated from a `[networks.<name>]` table."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# Like matrix.toml's names: they end up in namespace names, file names and metric labels.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_QUANTITY = re.compile(r"^([+-]?\d+(?:\.\d+)?)\s*(\S*)$")
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# SI prefixes, as tc counts them (tc's "bps" means bytes per second, so it is not offered here).
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


class NetworkProfileError(ValueError):
    """A [networks.<name>] table is invalid; the message names the table and key."""


@dataclass(frozen=True)
class NetworkProfile:
    """Conditions applied to each direction of the link, as netem takes them.

    A round trip therefore sees twice the delay and a loss chance in each direction.
    """

    name: str
    delay_s: float = 0.0  # one way
    jitter_s: float = 0.0  # one way: each packet's delay is uniform in delay +/- jitter
    loss_percent: float = 0.0  # per packet, per direction
    rate_bps: int | None = None  # bits per second per direction; None: unlimited

    @property
    def rtt_s(self) -> float:
        """The round trip the profile promises (jitter averages out)."""
        return 2 * self.delay_s

    @property
    def emulated(self) -> bool:
        """False for a profile without conditions (loopback): no namespaces or emulator needed."""
        return bool(self.delay_s or self.jitter_s or self.loss_percent or self.rate_bps)


def _problem(message: str, value: object) -> PydanticCustomError:
    """A validation error whose message may show the offending value as {value} (as in matrix.py)."""
    return PydanticCustomError("network", message, {"value": repr(value)})


def _quantity(value: object, units: Mapping[str, float], example: str) -> tuple[float, float]:
    """(number, unit factor) from "<number><unit>"; the unit is compulsory: a bare 25 could be s or ms."""
    if not isinstance(value, str):
        raise _problem(f"{{value}} must be a string with a unit (e.g. {example!r})", value)
    match = _QUANTITY.match(value.strip())
    if not match:
        raise _problem(f"{{value}} is not a number with a unit (e.g. {example!r})", value)
    unit = match[2].lower()
    if unit not in units:
        known = ", ".join(units)
        raise _problem(f"unknown unit {unit or 'none'!r} in {{value}} (known: {known})", value)
    number = float(match[1])
    if number < 0:
        raise _problem("{value} must not be negative", value)
    return number, units[unit]


def _seconds(value: object) -> float:
    number, factor = _quantity(value, _TIME_UNITS, "25ms")
    return number * factor


def _bits_per_second(value: object) -> int:
    number, factor = _quantity(value, _RATE_UNITS, "10mbit")
    bps = round(number * factor)
    if bps <= 0:
        raise _problem("{value} must be above zero (leave rate out for an unlimited link)", value)
    return bps


def _percent(value: object) -> float:
    number, _ = _quantity(value, {"%": 1.0}, "1%")
    if number > 100:
        raise _problem("{value} must be between 0% and 100%", value)
    return number


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise _problem("name must be letters, digits, '-' or '_'", value)
    return value


Time = Annotated[float, BeforeValidator(_seconds)]
Rate = Annotated[int, BeforeValidator(_bits_per_second)]
Percent = Annotated[float, BeforeValidator(_percent)]
Name = Annotated[str, AfterValidator(_name)]


class NetworkSpec(BaseModel):
    """[networks.<name>]: one emulated link, each value applied to both directions.

    The issue's profiles (delay and jitter are one way, so an RTT is twice the delay)::

        [networks.loopback]          # today's: 127.0.0.1, no namespaces, no emulator

        [networks.lan]
        delay = "0.25ms"             # 0.5 ms RTT

        [networks.wan]
        delay = "25ms"               # 50 ms RTT
        jitter = "5ms"

        [networks.lossy]
        delay = "25ms"               # 50 ms RTT
        loss = "1%"

        [networks.narrow]
        delay = "10ms"               # 20 ms RTT
        rate = "10mbit"

    matrix.py can embed it as `networks: Entries[NetworkSpec]`: its errors then read
    "[networks.wan] delay: ..." like every other table's.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    delay: Time = 0.0
    jitter: Time = 0.0
    loss: Percent = 0.0
    rate: Rate | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: object) -> object:
        # extra="forbid" would reject the key too, but not list the keys that are allowed.
        unknown = sorted(set(data) - set(cls.model_fields)) if isinstance(data, dict) else []
        if unknown:
            known = ", ".join(sorted(cls.model_fields))
            raise PydanticCustomError(
                "unknown_key", "unknown key {key} (known: {known})", {"key": repr(unknown[0]), "known": known}
            )
        return data

    @field_validator("jitter")
    @classmethod
    def _jitter_within_delay(cls, value: float, info: ValidationInfo) -> float:
        # netem would clip the negative delays to zero, skewing the mean the RTT check expects.
        delay = info.data.get("delay")
        if delay is not None and value > delay:
            raise _problem("{value} must not exceed delay", f"{value * 1000:g}ms")
        return value

    def build(self, name: str) -> NetworkProfile:
        return NetworkProfile(name, self.delay, self.jitter, self.loss, self.rate)


_NETWORKS = TypeAdapter[dict[Name, NetworkSpec]](dict[Name, NetworkSpec])


def parse_networks(data: Mapping[str, Any]) -> dict[str, NetworkProfile]:
    """The profiles of a decoded `networks` table; errors read "[networks.wan] delay: ..."."""
    try:
        specs = _NETWORKS.validate_python(dict(data))
    except ValidationError as exc:
        raise _error(exc) from exc
    return {name: spec.build(name) for name, spec in specs.items()}


def _error(exc: ValidationError) -> NetworkProfileError:
    """Pydantic's first error in the file's terms, in matrix.py's format."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"] if part != "[key]"]
    if error["type"] == "model_type":
        problem = f"{error['input']!r} must be a table"
    elif error["type"] == "dict_type":
        return NetworkProfileError(f"[networks]: {error['input']!r} must be a table")
    else:
        problem = error["msg"]
    table, keys = f"[networks.{loc[0]}]", " ".join(loc[1:])
    return NetworkProfileError(f"{table} {keys}: {problem}" if keys else f"{table}: {problem}")
