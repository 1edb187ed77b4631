"""The records an upload scenario sends: one body made from the record pool before the run.

k6 reads the file once, in its init stage, and sends the same bytes every iteration (REST) or the same
object (gRPC), so the load generator builds nothing per request. The records are the pool's first
`count`, as the servers' own pool gives them (same RECORD_POOL_SIZE and RECORD_SEED as the target), and
the body is the GET body of (count, offset=0): the same bytes in either direction.
"""

import itertools
from dataclasses import dataclass
from pathlib import Path

import orjson

from labrunner.files import write_bytes_atomic
from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD, Scenario
from services.common.environment import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_POOL_SIZE, DEFAULT_SEED
from services.common.pool import JsonRecord, load_pool
from services.common.shapes import shape_kit

# The servers' defaults (services/common/config.py), unless the target's env sets them.


@dataclass(frozen=True)
class UploadBody:
    """An upload's body on disk, and what a server must answer for it."""

    path: Path
    count: int
    checksum: int  # CreateRecordsReply.checksum of these records (the shape's, services.common.shapes)
    shape: str = DEFAULT_SHAPE  # the records' shape


def pool_of(scenario: Scenario) -> tuple[int, int]:
    """The (RECORD_POOL_SIZE, RECORD_SEED) the scenario's service serves from."""
    env = dict(scenario.target.env)
    return int(env.get("RECORD_POOL_SIZE", DEFAULT_POOL_SIZE)), int(env.get("RECORD_SEED", DEFAULT_SEED))


def max_request_bytes_of(scenario: Scenario) -> int:
    """The MAX_REQUEST_BYTES the scenario's service takes."""
    return int(dict(scenario.target.env).get("MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES))


def first_records(scenario: Scenario) -> list[JsonRecord]:
    """The scenario's `count` records from pool position 0, of its shape: what its service answers to
    (count, offset=0), and what an upload sends."""
    size, seed = pool_of(scenario)
    pool = load_pool(size, seed, scenario.shape)
    return list(itertools.islice(itertools.cycle(pool), scenario.count))


def upload_body(directory: Path, scenario: Scenario) -> UploadBody | None:
    """An upload scenario's body in directory (k6's files, which every backend hands to k6), written
    once for each pool, shape and count: every repeat and target of a run sends the same file. None
    for a download."""
    if scenario.direction != UPLOAD:
        return None
    size, seed = pool_of(scenario)
    records = first_records(scenario)
    shape = "" if scenario.shape == DEFAULT_SHAPE else f"-{scenario.shape}"  # cars keeps its name
    path = directory / f"upload{shape}-p{size}-s{seed}-c{scenario.count}.json"
    if not path.exists():
        write_bytes_atomic(path, orjson.dumps({"records": records}))
    kit = shape_kit(scenario.shape)
    checksum = kit.checksum(kit.from_json(r) for r in records)
    return UploadBody(path, scenario.count, checksum, scenario.shape)
