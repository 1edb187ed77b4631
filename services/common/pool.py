"""The record pool's data: a Faker pool from a fixed seed, as JSON dicts, cached in a temp file; one
pool per record shape (SHAPES: cars, the default, and services.common.shape_pool's three).

No serving code: the lab's servers (services.common.records turns the pool into their typed records),
the floor servers (benchmarks/floor, which hold it as flat tuples) and the runner all start from
this JSON, the contract's canonical form (protobuf canonical field names: driverId).
"""

import os
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson
from faker import Faker

from services.common.shape_pool import nested_record, numeric_record, text_record

# A record as JSON, with the protobuf canonical field names (driverId, not driver_id).
JsonRecord = dict[str, Any]
# make, model, trim, color, year, mileage, firstname, lastname, driver_id: the proto's order.
Fields = tuple[str, str, str, str, int, int, str, str, str]

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

# The record shapes, cars first (the default: every result without a shape is of cars).
SHAPES = ("cars", "numeric", "text", "nested")
DEFAULT_SHAPE = SHAPES[0]
# The user's own message (services.common.user_message), from the files in SHAPE_DIR.
USER_SHAPE = "proto"


def fake_fields(faker: Faker) -> Fields:
    """One random record's fields (Faker is called in a fixed order, so a seeded Faker repeats them)."""
    make, model = faker.random_element(_MODELS)
    trim = faker.random_element(_CATALOGUE[make][model])
    color = faker.color_name()
    year = faker.random_int(1995, 2026)
    mileage = faker.random_int(0, 300_000)
    firstname, lastname = faker.first_name(), faker.last_name()
    return (make, model, trim, color, year, mileage, firstname, lastname, faker.bothify("DRV-########"))


def json_record(fields: Fields) -> JsonRecord:
    """One record's fields as the contract's JSON dict."""
    make, model, trim, color, year, mileage, firstname, lastname, driver_id = fields
    car = {"make": make, "model": model, "trim": trim, "color": color, "year": year, "mileage": mileage}
    return {"car": car, "driver": {"firstname": firstname, "lastname": lastname, "driverId": driver_id}}


def _cars_record(faker: Faker) -> dict[str, Any]:
    return json_record(fake_fields(faker))


_GENERATORS = {"cars": _cars_record, "numeric": numeric_record, "text": text_record, "nested": nested_record}
# Shapes whose pool comes from elsewhere (services.common.user_message: the user's own message), by
# name: (size, seed) -> the pool, and a key for its cache file that changes with what makes the records.
_REGISTERED: dict[str, tuple[Callable[[int, int], list[JsonRecord]], str]] = {}


def register_shape(shape: str, generate: Callable[[int, int], list[JsonRecord]], key: str) -> None:
    """Make generate_pool and load_pool serve a shape beside SHAPES, for this process."""
    _REGISTERED[shape] = (generate, key)


def unregister_shape(shape: str) -> None:
    """Undo register_shape (a shape not registered is fine)."""
    _REGISTERED.pop(shape, None)


def generate_pool(size: int, seed: int, shape: str = DEFAULT_SHAPE) -> list[JsonRecord]:
    """The deterministic pool of a shape as JSON: the same (size, seed, shape) gives the same records
    in any process. A shape not in SHAPES (nor registered) is a ValueError naming them."""
    if shape in _REGISTERED:
        return _REGISTERED[shape][0](size, seed)
    try:
        generator = _GENERATORS[shape]
    except KeyError:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(SHAPES)}") from None
    faker = Faker("en_US")
    faker.seed_instance(seed)
    return [generator(faker) for _ in range(size)]


def load_pool(size: int, seed: int, shape: str = DEFAULT_SHAPE) -> list[JsonRecord]:
    """generate_pool, cached in a temp file: 10,000 records take ~2.4 s to generate, ~20 ms to load.

    Spawned workers (Hypercorn) and repeated scenario starts then skip Faker entirely.
    The cache key holds the Faker version, whose data decides the records.
    """
    cache = _pool_cache(size, seed, shape)
    try:
        cached: list[JsonRecord] = orjson.loads(cache.read_bytes())
        return cached
    except (FileNotFoundError, orjson.JSONDecodeError):
        pool = generate_pool(size, seed, shape)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(orjson.dumps(pool))
        partial.replace(cache)  # atomic: a concurrent reader never sees half a file
        return pool


def ensure_pool_cached(size: int, seed: int, shape: str = DEFAULT_SHAPE) -> None:
    """Generate the pool's cache file when it is missing, without loading it when it is not: a process
    that forks workers calls this, and each worker loads the pool itself (see WorkerContext.records in
    services/common/supervisor.py)."""
    if not _pool_cache(size, seed, shape).exists():
        load_pool(size, seed, shape)


def _pool_cache(size: int, seed: int, shape: str) -> Path:
    # cars keeps the name it had before there were shapes.
    if shape in _REGISTERED:
        shape = f"{shape}-{_REGISTERED[shape][1]}"
    name = (
        f"protolab-pool-{size}-{seed}" if shape == DEFAULT_SHAPE else f"protolab-pool-{shape}-{size}-{seed}"
    )
    return Path(tempfile.gettempdir()) / f"{name}-faker{version('faker')}.json"
