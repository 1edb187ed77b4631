"""The domain records in one neutral form every server shares: a Faker pool from a fixed seed.

Every server builds the same pool from the same seed, so record i of a response is
pool[(offset + i) % pool_size] everywhere. Generating records per request with Faker
would hide every protocol difference (its cost: docs/results.md, "Record generation"); it
stays available as RECORD_MODE=live, measured and labelled.

The pool is generated and cached as JSON by services.common.pool (the contract's canonical
form, which the runner's payload table and the floor servers read too); a server converts it
once, at start, into the neutral records it serves (record_from_json).
"""

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from faker import Faker

# The pool's data lives in services.common.pool (no serving code, so the floors import it); its
# names stay importable from here (re-exported: "as" is what mypy's strict mode takes for that).
from services.common.pool import JsonRecord as JsonRecord  # noqa: PLC0414
from services.common.pool import ensure_pool_cached as ensure_pool_cached  # noqa: PLC0414
from services.common.pool import fake_fields
from services.common.pool import generate_pool as generate_pool  # noqa: PLC0414
from services.common.pool import load_pool as load_pool  # noqa: PLC0414

T = TypeVar("T")


# The neutral form: immutable tuples with the proto's field names, in the proto's order
# (tests/unit/test_contract.py holds them to the descriptor). Neither the JSON dicts nor the
# protobuf messages the servers send, so under RESPONSE_MODEL=build no protocol finds its
# objects ready-made: REST maps each record into dicts, gRPC into messages. Tuples because
# they are cheap to hold and read: fields are read by index in C, and a record's three
# tuples take 208 bytes against 640 for the nested dicts (a slotted frozen dataclass reads
# as fast but builds slower, through object.__setattr__: docs/results.md, "Record generation").
class Car(NamedTuple):
    make: str
    model: str
    trim: str
    color: str
    year: int
    mileage: int


class Driver(NamedTuple):
    firstname: str
    lastname: str
    driver_id: str


class Record(NamedTuple):
    car: Car
    driver: Driver


class BadRequest(ValueError):
    """A request parameter is out of range; the message is safe to return to the client."""


def fake_record(faker: Faker) -> Record:
    """One random record (Faker is called in a fixed order, so a seeded Faker repeats its records)."""
    make, model, trim, color, year, mileage, firstname, lastname, driver_id = fake_fields(faker)
    return Record(Car(make, model, trim, color, year, mileage), Driver(firstname, lastname, driver_id))


def json_records(records: Sequence[Record]) -> list[JsonRecord]:
    """The records as the REST body holds them: the protobuf canonical JSON mapping.

    The tuples are unpacked in the comprehension itself, faster than through a function per
    record reading the fields by name (measured: docs/results.md, "Record generation").
    """
    return [
        {
            "car": {
                "make": make,
                "model": model,
                "trim": trim,
                "color": color,
                "year": year,
                "mileage": mileage,
            },
            "driver": {"firstname": firstname, "lastname": lastname, "driverId": driver_id},
        }
        for (make, model, trim, color, year, mileage), (firstname, lastname, driver_id) in records
    ]


def checksum(records: Iterable[Record]) -> int:
    """What an upload's reply says of the records the server decoded (CreateRecordsReply.checksum).

    The sum over the records of their two ints and the lengths of their seven strings, modulo 2**32:
    every field of every record is read, and a record lost, repeated, cut or with a number changed
    changes it. Cheap (no hashing, no encoding), so an upload measures decoding, not the check.
    """
    total = 0
    for (make, model, trim, color, year, mileage), (firstname, lastname, driver_id) in records:
        total += (
            year
            + mileage
            + len(make)
            + len(model)
            + len(trim)
            + len(color)
            + len(firstname)
            + len(lastname)
            + len(driver_id)
        )
    return total & 0xFFFFFFFF


def record_from_json(record: JsonRecord) -> Record:
    """The neutral record of one of json_records' dicts."""
    driver = record["driver"]
    return Record(Car(**record["car"]), Driver(driver["firstname"], driver["lastname"], driver["driverId"]))


def _window(items: list[T], extra: int) -> list[T]:
    """items followed by its first `extra` items again (cycling), so a run of up to `extra` items
    from any start is one slice; the repeats are the same objects."""
    return list(itertools.islice(itertools.cycle(items), len(items) + extra))


@dataclass
class RecordSource:
    """Serves neutral records from the pool by (count, offset), or live Faker records when mode is 'live'."""

    pool: list[Any]  # the shape's neutral records (cars: Record; services.common.shapes)
    max_count: int
    default_count: int
    live: bool = False

    def __post_init__(self) -> None:
        self._window = _window(self.pool, self.max_count)
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

    def records(self, count: int, offset: int | None) -> list[Any]:
        """count records from pool position offset; without offset, rotate through the pool."""
        if self._faker is not None:
            return [fake_record(self._faker) for _ in range(count)]
        start = self.start(count, offset)
        return self._window[start : start + count]


class Prebuilt(Generic[T]):
    """RESPONSE_MODEL=prebuilt: one protocol object per pool record, built once at start, served
    by (count, offset) as slices of those same objects (and the same rotation as the source)."""

    def __init__(self, source: RecordSource, build: Callable[[list[Record]], list[T]]) -> None:
        self._source = source
        self._window = _window(build(source.pool), source.max_count)

    def objects(self, count: int, offset: int | None) -> list[T]:
        start = self._source.start(count, offset)
        return self._window[start : start + count]


def parse_query_int(name: str, raw: str | None) -> int | None:
    """A query parameter as an int, or BadRequest naming the parameter.

    int() also takes " 7", "+7", "1_000" and non-ASCII digits, which the OpenAPI integer does not:
    only ASCII digits pass, after an optional "-". Checked with str methods and a plain try, as
    every request parses its count: a regex match or a contextlib.suppress costs several times more.
    """
    if raw is None:
        return None
    digits = raw[1:] if raw[:1] == "-" else raw
    if not (digits.isdigit() and digits.isascii()):
        raise BadRequest(f"{name} must be an integer, got {raw!r}")
    try:
        return int(raw)
    except ValueError:  # more digits than int() takes (sys.get_int_max_str_digits)
        raise BadRequest(f"{name} must be an integer, got {raw!r}") from None
