"""What mapping typed records costs per request: the lab's NamedTuple records against the floor's flat tuples.

The README's figure for the `build` response model ("mapping 100 typed records costs about 8 µs a
request more on REST") and docs/results.md's "What remains, named" come from this script. Both sides
map the same records (the pool's, count of them from one offset) and the outputs are checked equal:

- REST: the lab's json_records from its Record/Car/Driver NamedTuples against the floor's mapping
  (benchmarks.floor.bodies.documents) from flat 9-tuples, alone and with orjson.dumps of the body;
- gRPC: filling a ListRecordsResponse's messages in place (response.records.add()) through the
  lab's fill_record from the typed records against the floor's fill from flat tuples, alone and with
  SerializeToString.

Each figure is timeit's best of --repeat runs (the least disturbed one), typed and flat runs
alternating, in µs per request. No
cgroup and no server: a single-threaded CPU cost on this host, so run it on a quiet one:

    .venv/bin/python benchmarks/mapping_cost.py [--count 100] [--repeat 7]
"""

import argparse
import platform
import sys
import timeit
from collections.abc import Callable

import orjson

from benchmarks.floor.bodies import documents
from benchmarks.floor.common import FlatRecord
from benchmarks.floor.messages import filled as fill_flat
from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.messages import fill_record
from services.common.pb import cars_pb2
from services.common.pool import load_pool
from services.common.records import Record, json_records, record_from_json


def _flat(record: Record) -> FlatRecord:
    (make, model, trim, color, year, mileage), (firstname, lastname, driver_id) = record
    return (make, model, trim, color, year, mileage, firstname, lastname, driver_id)


def best_us(typed: Callable[[], object], flat: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Each side's best of `repeat` timeit runs (each long enough, ~0.2 s, to time), in µs per call.
    The runs alternate, typed then flat, so that what else the host runs weighs on both alike."""
    timers = [timeit.Timer(typed), timeit.Timer(flat)]
    numbers = [timer.autorange()[0] for timer in timers]
    best = [
        min(timer.timeit(number) / number for _ in range(repeat))
        for timer, number in zip(timers, numbers, strict=True)
    ]
    return best[0] * 1e6, best[1] * 1e6


def measure(count: int, offset: int, repeat: int) -> dict[str, tuple[float, float]]:
    """µs per request of each mapping, typed and flat, by name; the two sides' outputs checked equal first."""
    pool = load_pool(DEFAULT_POOL_SIZE, DEFAULT_SEED)
    typed = [record_from_json(pool[(offset + i) % DEFAULT_POOL_SIZE]) for i in range(count)]
    flat = [_flat(record) for record in typed]

    def rest_typed() -> bytes:
        return orjson.dumps({"records": json_records(typed)})

    def rest_flat() -> bytes:
        return orjson.dumps({"records": documents(flat)})

    def grpc_typed() -> cars_pb2.ListRecordsResponse:
        response = cars_pb2.ListRecordsResponse()
        add = response.records.add
        for record in typed:
            fill_record(add(), record)
        return response

    def grpc_flat() -> cars_pb2.ListRecordsResponse:
        response = cars_pb2.ListRecordsResponse()
        add = response.records.add
        for record in flat:
            fill_flat(add(), record)
        return response

    if rest_typed() != rest_flat() or grpc_typed().SerializeToString() != grpc_flat().SerializeToString():
        raise AssertionError("the typed and the flat mapping give different bytes")
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "REST dicts (json_records | documents)": (lambda: json_records(typed), lambda: documents(flat)),
        "REST dicts + orjson.dumps": (rest_typed, rest_flat),
        "gRPC fill (fill_record | floor's fill)": (grpc_typed, grpc_flat),
        "gRPC fill + SerializeToString": (
            lambda: grpc_typed().SerializeToString(),
            lambda: grpc_flat().SerializeToString(),
        ),
    }
    return {name: best_us(typed_work, flat_work, repeat) for name, (typed_work, flat_work) in cases.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="records per request")
    parser.add_argument("--offset", type=int, default=0, help="the pool position of the first record")
    parser.add_argument("--repeat", type=int, default=7, help="timeit runs; the best is reported")
    args = parser.parse_args()
    results = measure(args.count, args.offset, args.repeat)
    python = platform.python_version()
    print(f"{args.count} records a request, best of {args.repeat} alternating runs, µs; Python {python}")
    print(f"  {'':<40} {'typed':>7} {'flat':>7} {'typed - flat':>12}")
    for name, (typed, flat) in results.items():
        print(f"  {name:<40} {typed:7.1f} {flat:7.1f} {typed - flat:+9.1f} ({typed / flat:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
