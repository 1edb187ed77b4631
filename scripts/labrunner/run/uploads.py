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
from labrunner.model.scenario import UPLOAD, Scenario
from services.common.records import checksum, load_pool, record_from_json

# The servers' defaults (services/common/config.py), unless the target's env sets them.
POOL_SIZE, POOL_SEED = 10_000, 42


@dataclass(frozen=True)
class UploadBody:
    """An upload's body on disk, and what a server must answer for it."""

    path: Path
    count: int
    checksum: int  # CreateRecordsReply.checksum of these records (services.common.records.checksum)


def upload_body(directory: Path, scenario: Scenario) -> UploadBody | None:
    """An upload scenario's body in directory (k6's files, which every backend hands to k6), written
    once for each pool and count: every repeat and target of a run sends the same file. None for a
    download."""
    if scenario.direction != UPLOAD:
        return None
    env = dict(scenario.target.env)
    size = int(env.get("RECORD_POOL_SIZE", POOL_SIZE))
    seed = int(env.get("RECORD_SEED", POOL_SEED))
    records = list(itertools.islice(itertools.cycle(load_pool(size, seed)), scenario.count))
    path = directory / f"upload-p{size}-s{seed}-c{scenario.count}.json"
    if not path.exists():
        write_bytes_atomic(path, orjson.dumps({"records": records}))
    return UploadBody(path, scenario.count, checksum(record_from_json(r) for r in records))
