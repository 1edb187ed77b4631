"""Terms the matrix's schema shares with the Python load driver (labrunner.run.drive), in a module that
imports the standard library alone: the driver's start counts in its CPU share, as k6's does, and the
schema's pydantic with the scenarios' services imports (Faker's record pool) cost it about 0.3 s of CPU
at every start (docs/http3.md)."""

import re

# The HTTP version a REST service must report for each protocol (EXPECT_PROTO, docs/CONTRACTS.md).
REST_PROTO = {"http1.1": "HTTP/1.1", "http2": "HTTP/2.0", "http3": "HTTP/3"}
DRIVER_LOAD_MODELS = ("constant-vus", "constant-arrival-rate")  # the executors the driver runs

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_EXAMPLES = "e.g. '500ms', '30s', '1m30s'"


def seconds_or_none(value: object) -> float | None:
    """Seconds from a k6-style duration ("500ms", "30s", "1m30s") or a number of seconds; None when
    the value is neither."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if _SECONDS.match(text):
            return float(text)
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    return None


def duration_seconds(text: str) -> float:
    """A k6-style duration as seconds; ValueError when it is none."""
    seconds = seconds_or_none(text)
    if seconds is None:
        raise ValueError(f"{text!r} is not a duration ({DURATION_EXAMPLES})")
    return seconds
