"""The record pool: Faker records generated once from a fixed seed, served by (count, offset).

Every server builds the same pool from the same seed, so record i of a response is
pool[(offset + i) % pool_size] everywhere. Generating records per request with Faker
costs 130-500 us per record and would hide every protocol difference; it stays
available as RECORD_MODE=live, measured and labelled.
"""

import contextlib
import itertools
import os
import re
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson
from faker import Faker

Record = dict[str, dict[str, Any]]

# Faker has no vehicle provider; a small fixed catalogue keeps records realistic.
_CATALOGUE: dict[str, dict[str, tuple[str, ...]]] = {
    "Toyota": {"Corolla": ("L", "LE", "XSE"), "Camry": ("LE", "SE", "XLE"), "RAV4": ("LE", "XLE")},
    "Ford": {"Focus": ("S", "SE", "Titanium"), "F-150": ("XL", "XLT", "Lariat")},
    "Honda": {"Civic": ("LX", "Sport", "EX"), "Accord": ("LX", "EX-L", "Touring")},
    "Volkswagen": {"Golf": ("S", "SE", "GTI"), "Passat": ("S", "SE", "R-Line")},
    "BMW": {"3 Series": ("320i", "330i", "M340i"), "X5": ("sDrive40i", "xDrive50e")},
    "Tesla": {"Model 3": ("Standard", "Long Range", "Performance"), "Model Y": ("AWD",)},
    "Hyundai": {"Elantra": ("SE", "SEL", "N Line"), "Tucson": ("SE", "SEL", "Limited")},
    "Renault": {"Clio": ("Life", "Zen", "Intens"), "Megane": ("Zen", "Intens")},
}
_MODELS = [(make, model) for make, models in _CATALOGUE.items() for model in models]
_QUERY_INT = re.compile(r"-?[0-9]+")


class BadRequest(ValueError):
    """A request parameter is out of range; the message is safe to return to the client."""


def fake_record(faker: Faker) -> Record:
    """One record with the protobuf canonical JSON field names (driverId, not driver_id)."""
    make, model = faker.random_element(_MODELS)
    return {
        "car": {
            "make": make,
            "model": model,
            "trim": faker.random_element(_CATALOGUE[make][model]),
            "color": faker.color_name(),
            "year": faker.random_int(1995, 2026),
            "mileage": faker.random_int(0, 300_000),
        },
        "driver": {
            "firstname": faker.first_name(),
            "lastname": faker.last_name(),
            "driverId": faker.bothify("DRV-########"),
        },
    }


def generate_pool(size: int, seed: int) -> list[Record]:
    """The deterministic pool: the same (size, seed) gives the same records in any process."""
    faker = Faker("en_US")
    faker.seed_instance(seed)
    return [fake_record(faker) for _ in range(size)]


def load_pool(size: int, seed: int) -> list[Record]:
    """generate_pool, cached in a temp file: 10,000 records take ~2.4 s to generate, ~20 ms to load.

    Spawned workers (Hypercorn) and repeated scenario starts then skip Faker entirely.
    The cache key holds the Faker version, whose data decides the records.
    """
    cache = Path(tempfile.gettempdir()) / f"protolab-pool-{size}-{seed}-faker{version('faker')}.json"
    try:
        return orjson.loads(cache.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        pool = generate_pool(size, seed)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(orjson.dumps(pool))
        partial.replace(cache)  # atomic: a concurrent reader never sees half a file
        return pool


@dataclass
class RecordSource:
    """Serves slices of the pool, or live Faker records when mode is 'live'."""

    pool: list[Record]
    max_count: int
    default_count: int
    live: bool = False

    def __post_init__(self) -> None:
        # The pool followed by its first max_count records, so any window is one slice.
        wrapped = itertools.islice(itertools.cycle(self.pool), self.max_count)
        self._window = self.pool + list(wrapped)
        self._cursor = 0
        self._faker = Faker("en_US") if self.live else None

    def validate(self, count: int | None, offset: int | None) -> tuple[int, int | None]:
        """Apply the defaults and bounds; raise BadRequest with a client-facing message."""
        if count is None:
            count = self.default_count
        if count < 1 or count > self.max_count:
            raise BadRequest(f"count must be between 1 and {self.max_count}, got {count}")
        if offset is not None and offset < 0:
            raise BadRequest(f"offset must be >= 0, got {offset}")
        return count, offset

    def start(self, count: int, offset: int | None) -> int:
        """The pool position of a response's first record; without offset, rotate through the pool."""
        if offset is None:
            offset = self._cursor
            self._cursor = (self._cursor + count) % len(self.pool)
        return offset % len(self.pool)

    def records(self, count: int, offset: int | None) -> list[Record]:
        """count records from pool position offset; without offset, rotate through the pool."""
        if self._faker is not None:
            return [fake_record(self._faker) for _ in range(count)]
        start = self.start(count, offset)
        return self._window[start : start + count]


def parse_query_int(name: str, raw: str | None) -> int | None:
    """A query parameter as an int, or BadRequest naming the parameter."""
    if raw is None:
        return None
    # int() also takes " 7", "+7", "1_000" and non-ASCII digits, which the OpenAPI integer does not.
    if _QUERY_INT.fullmatch(raw):
        with contextlib.suppress(ValueError):  # past int()'s digit limit
            return int(raw)
    raise BadRequest(f"{name} must be an integer, got {raw!r}")
