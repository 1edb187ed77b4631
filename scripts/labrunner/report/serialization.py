"""Serialization micro-benchmark: encode and decode a response with orjson, stdlib json and protobuf."""

import gc
import itertools
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import orjson
from google.protobuf.internal import api_implementation

from labrunner.report.payload import json_body, pool_records, protobuf_message
from labrunner.report.stats import summarize
from services.common.pool import DEFAULT_SHAPE

# /2: geometric mean and log-scale interval; /1 held BenchmarkDotNet's mean and Error.
SCHEMA = "protolab.serialization/2"
FILE = "serialization.json"  # in a run's directory
CODECS = ("orjson", "json", "protobuf")
OPERATIONS = ("encode", "decode")


@dataclass(frozen=True)
class Budget:
    """How long to measure: iterations of at least iteration_s each, per case."""

    counts: tuple[int, ...]
    iterations: int
    iteration_s: float
    warmup_s: float


FULL = Budget(counts=(1, 10, 100, 1000), iterations=15, iteration_s=0.01, warmup_s=0.02)
QUICK = Budget(counts=(10, 100), iterations=5, iteration_s=0.002, warmup_s=0.005)


@dataclass(frozen=True)
class Case:
    """One (codec, operation, count) measured: per-operation time in microseconds."""

    codec: str
    operation: str
    count: int
    bytes: int  # the encoded size
    operations_per_iteration: int
    n: int
    geomean_us: float
    low_us: float | None  # the log-scale interval of stats.summarize
    high_us: float | None
    min_us: float
    max_us: float
    shape: str = DEFAULT_SHAPE  # the record shape encoded (a file written before shapes: cars)


def workloads(
    count: int, shape: str = DEFAULT_SHAPE
) -> dict[tuple[str, str], tuple[Callable[[], object], int]]:
    """(codec, operation) -> (one operation, encoded bytes), all on the same records of `shape`.

    Encode starts from what each server holds: the pool's dicts for JSON, prebuilt
    messages for protobuf (the gRPC service builds responses once and serializes per call).
    Decode ends in what a client gets: dicts for JSON, a message for protobuf. upb parses
    eagerly but creates Python objects for fields only when they are read.

    Decode is also what an upload's server does first (payload_model.format_lines): the upload's
    JSON body is this GET body (run/uploads.py), and CreateRecordsRequest has ListRecordsResponse's
    wire format (repeated Record records = 1), so parsing one costs what parsing the other does.
    """
    records = pool_records(count, shape)
    document = {"records": records}
    message = protobuf_message(records, shape)
    encoded_json = json_body(records)
    encoded_pb = message.SerializeToString()
    parse = type(message).FromString
    return {
        ("orjson", "encode"): (lambda: orjson.dumps(document), len(encoded_json)),
        ("orjson", "decode"): (lambda: orjson.loads(encoded_json), len(encoded_json)),
        ("json", "encode"): (lambda: _stdlib_dumps(document), len(encoded_json)),
        ("json", "decode"): (lambda: json.loads(encoded_json), len(encoded_json)),
        ("protobuf", "encode"): (message.SerializeToString, len(encoded_pb)),
        ("protobuf", "decode"): (lambda: parse(encoded_pb), len(encoded_pb)),
    }


def _stdlib_dumps(document: object) -> bytes:
    # Compact and unescaped: byte for byte the body orjson writes.
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def measure_case(operation: Callable[[], object], budget: Budget) -> tuple[int, list[float]]:
    """(operations per iteration, per-operation seconds of each iteration).

    Like BenchmarkDotNet: warm up, pick an operation count that makes one iteration last
    at least iteration_s (so the clock's resolution does not matter), then time iterations.
    The garbage collector stays on: collecting what decoding allocates is part of its cost.
    """
    deadline = time.perf_counter() + budget.warmup_s
    while time.perf_counter() < deadline:
        operation()
    ops = 1
    while True:
        began = time.perf_counter()
        for _ in range(ops):
            operation()
        elapsed = time.perf_counter() - began
        if elapsed >= budget.iteration_s:
            break
        ops = max(ops * 2, int(ops * budget.iteration_s / max(elapsed, 1e-9)))
    samples = []
    for _ in range(budget.iterations):
        began = time.perf_counter()
        for _ in range(ops):
            operation()
        samples.append((time.perf_counter() - began) / ops)
    return ops, samples


def run(budget: Budget = FULL, shapes: Sequence[str] = (DEFAULT_SHAPE,)) -> list[Case]:
    """Every codec, operation and count of the budget, for each shape."""
    cases = []
    for shape, count in itertools.product(shapes, budget.counts):
        for (codec, op), (operation, size) in workloads(count, shape).items():
            gc.collect()  # start each case without garbage left by the previous one
            ops, samples = measure_case(operation, budget)
            s = summarize([sample * 1e6 for sample in samples])
            cases.append(
                Case(
                    codec=codec,
                    operation=op,
                    count=count,
                    bytes=size,
                    operations_per_iteration=ops,
                    n=s.n,
                    geomean_us=s.centre,
                    low_us=s.low,
                    high_us=s.high,
                    min_us=s.minimum,
                    max_us=s.maximum,
                    shape=shape,
                )
            )
    return cases


def as_document(cases: Sequence[Case], budget: Budget) -> dict[str, Any]:
    """serialization.json: the cases plus what they ran on."""
    return {
        "schema": SCHEMA,
        "budget": asdict(budget),
        "quick": budget == QUICK,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "protobuf_backend": api_implementation.Type(),
        "versions": {name: metadata.version(name) for name in ("orjson", "protobuf")},
        "cpu": platform.processor() or platform.machine(),
        "cases": [asdict(case) for case in cases],
    }


def cases_from_document(document: Any) -> list[Case]:
    """The cases of a serialization.json; empty when it is not one."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return []
    return [Case(**case) for case in document["cases"]]
