"""What the cyclic garbage collector adds to a REST request's records, with the start-up heap frozen and not.

docs/measurement.md's "The garbage collector and the start-up heap" comes from this script. Each
setting runs in a fresh interpreter that imports what the lab's servers import (aiohttp, Quart,
Hypercorn, grpc) and holds the 10,000-record pool as a server does, then times, per record:

- upload: parsing and validating an upload body of count records (services.common.rest.records_from_body);
- download: mapping count pool records into the body's dicts and encoding them (json_records, orjson).

The three most recent requests' objects stay alive, as the requests in flight of a loaded server do.
Settings: default (the collector as CPython sets it), freeze (services.common.heap.freeze_startup, what
the servers do once they accept), off (gc.disable(), no collector at all: the floor of the other two).
CPU time of one thread, no server and no cgroup, so run it on a quiet host:

    .venv/bin/python benchmarks/collector_cost.py [--records 30000] [--rounds 3]
"""

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

COUNTS = (10, 100, 1000)
SETTINGS = ("default", "freeze", "off")
KEPT_ALIVE = 3  # requests whose objects are alive at once


def measure(setting: str, records: int) -> dict[str, dict[int, float]]:
    """µs per record by operation and count, in this process under setting."""
    import aiohttp  # noqa: F401, PLC0415  the servers' heaps
    import grpc  # noqa: F401, PLC0415
    import hypercorn.asyncio  # noqa: F401, PLC0415
    import orjson  # noqa: PLC0415
    import quart  # noqa: F401, PLC0415

    from services.common.environment import DEFAULT_POOL_SIZE, DEFAULT_SEED  # noqa: PLC0415
    from services.common.heap import freeze_startup  # noqa: PLC0415
    from services.common.records import json_records, load_pool, record_from_json  # noqa: PLC0415
    from services.common.rest import records_from_body  # noqa: PLC0415

    pool = [record_from_json(r) for r in load_pool(DEFAULT_POOL_SIZE, DEFAULT_SEED)]
    if setting == "freeze":
        freeze_startup(True)
    elif setting == "off":
        gc.disable()
    timings: dict[str, dict[int, float]] = {"upload": {}, "download": {}}
    for count in COUNTS:
        body = orjson.dumps({"records": json_records(pool[:count])})
        requests = max(records // count, 10)
        alive: list[object] = []
        started = time.process_time()
        for _ in range(requests):
            alive = [*alive[-KEPT_ALIVE + 1 :], records_from_body(body, count)]
        timings["upload"][count] = (time.process_time() - started) / requests / count * 1e6
        started = time.process_time()
        for i in range(requests):
            first = i * count % (len(pool) - count)
            alive = [
                *alive[-KEPT_ALIVE + 1 :],
                orjson.dumps({"records": json_records(pool[first : first + count])}),
            ]
        timings["download"][count] = (time.process_time() - started) / requests / count * 1e6
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=30_000, help="records per count and operation")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per setting, interleaved")
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.records)))
        return
    runs: dict[str, list[dict[str, dict[str, float]]]] = {s: [] for s in SETTINGS}
    for _ in range(args.rounds):
        for setting in SETTINGS:
            child = [sys.executable, __file__, "--child", setting, "--records", str(args.records)]
            runs[setting].append(json.loads(subprocess.run(child, capture_output=True, check=True).stdout))
    print(f"µs per record, median of {args.rounds} fresh processes (Python {sys.version.split()[0]})")
    print("setting   operation  " + "  ".join(f"{n:>6,}" for n in COUNTS) + "   1,000 / 100")
    for setting in SETTINGS:
        for operation in ("upload", "download"):
            cells = [statistics.median(r[operation][str(n)] for r in runs[setting]) for n in COUNTS]
            shown = "  ".join(f"{c:6.2f}" for c in cells)
            print(f"{setting:9} {operation:9}  {shown}   {cells[2] / cells[1]:.2f}x")


if __name__ == "__main__":
    main()
