"""Calibration: two fixed workloads that measure how fast this host runs what a server spends CPU on.

The CPU unit is the work of one build-model response of 100 records, on fixed synthetic
records (no Faker, no record pool, so code changes elsewhere cannot change the unit): map
them into dicts and serialize them with orjson, map them into protobuf messages and
serialize those. It is user-space Python and C, while much of a server's request is kernel
work (syscalls, loopback TCP, wakeups), which differs between hosts (virtualisation,
mitigations) more than a loop does. So the kernel unit is one small request/response round
trip over loopback TCP (KERNEL_REQUEST_BYTES in, KERNEL_RESPONSE_BYTES out), timed on the CPU
clock of the answering side, which sits where the service runs while the asking side sits
where k6 runs.

The runner runs both before the first scenario and after the last one, in a fresh
interpreter (`python -m labrunner.run.calibration --cpus N --peer-cpus M`) pinned to the
first scenario's service CPUs, and records their CPU time per unit. CPU per request divided
by a unit's time gives CPU per request in that unit.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from labrunner.backends.base import cpu_list
from labrunner.backends.cgroups import split_cpus
from labrunner.model.scenario import Scenario
from labrunner.observe import interference
from labrunner.say import Say

WORKLOAD = "protolab.calibration/1: 100 fixed records to orjson and to protobuf"  # change it, change this
RECORDS = 100
KERNEL_WORKLOAD = "protolab.calibration.kernel/1: loopback TCP round trips, 128 B in, 8 KiB out"
KERNEL_REQUEST_BYTES = 128
KERNEL_RESPONSE_BYTES = 8192
KERNEL_UNITS_PER_ROUND = 200
# Many short rounds: the fastest is the CPU's own speed; neighbours only ever slow a round down.
UNITS_PER_ROUND = 50
ROUNDS = 40
TIMEOUT_S = 120.0
# Before and after one run, the calibration should agree this closely; between two runs
# compared with --baseline, BASELINE_SPREAD.
RUN_SPREAD = 0.05
BASELINE_SPREAD = 0.10
# A calibration during which other processes used more than this share of the host's CPUs is
# taken again after a pause, at most CALIBRATION_ATTEMPTS times in all (--calibration-attempts).
QUIET_SHARE = 0.05
QUIET_WAIT_S = 5.0
CALIBRATION_ATTEMPTS = 3

_CARS = (
    ("Toyota", "Corolla", "LE"),
    ("Ford", "F-150", "XLT"),
    ("Honda", "Civic", "Sport"),
    ("Volkswagen", "Golf", "GTI"),
    ("BMW", "3 Series", "330i"),
    ("Tesla", "Model 3", "Long Range"),
    ("Hyundai", "Tucson", "Limited"),
)
_COLORS = ("red", "blue", "black", "white", "silver", "green", "grey", "yellow", "orange", "brown", "navy")
_FIRST = ("Ada", "Grace", "Linus", "Barbara", "Dennis", "Frances", "Ken", "Margaret", "Edsger", "Radia")
_LAST = ("Lovelace", "Hopper", "Torvalds", "Liskov", "Ritchie", "Allen", "Thompson", "Hamilton", "Dijkstra")

Record = tuple[tuple[str, str, str, str, int, int], tuple[str, str, str]]


def records(count: int = RECORDS) -> list[Record]:
    """Fixed synthetic records shaped like the lab's (proto/cars.proto): the same on every host."""
    return [
        (
            (*_CARS[i % len(_CARS)], _COLORS[i % len(_COLORS)], 1990 + i % 35, (i * 7919) % 250_000),
            (_FIRST[i % len(_FIRST)], _LAST[i % len(_LAST)], f"D{(i * 104_729) % 10**8:08d}"),
        )
        for i in range(count)
    ]


def unit(pool: Sequence[Record]) -> int:
    """One unit of work; returns the bytes produced so nothing is optimised away."""
    from services.common.pb import cars_pb2  # noqa: PLC0415 (only the measuring process needs it)

    body = orjson.dumps(
        {
            "records": [
                {
                    "car": {
                        "make": car[0],
                        "model": car[1],
                        "trim": car[2],
                        "color": car[3],
                        "year": car[4],
                        "mileage": car[5],
                    },
                    "driver": {"firstname": driver[0], "lastname": driver[1], "driverId": driver[2]},
                }
                for car, driver in pool
            ]
        }
    )
    message = cars_pb2.ListRecordsResponse(
        records=[
            cars_pb2.Record(
                car=cars_pb2.Car(
                    make=car[0], model=car[1], trim=car[2], color=car[3], year=car[4], mileage=car[5]
                ),
                driver=cars_pb2.Driver(firstname=driver[0], lastname=driver[1], driver_id=driver[2]),
            )
            for car, driver in pool
        ]
    )
    return len(body) + len(message.SerializeToString())


def measure(units_per_round: int = UNITS_PER_ROUND, rounds: int = ROUNDS) -> dict[str, Any]:
    """Run the workload in this thread: one warm-up round, then `rounds` timed by thread CPU time.

    The unit's time is the fastest round's: what shares the core (caches, an SMT sibling)
    inflates CPU time and never deflates it, so the fastest round is closest to the CPU's
    own speed (timeit's reasoning). The median and the spread are recorded beside it.
    """
    pool = records()
    for _ in range(units_per_round):
        unit(pool)
    per_unit = []
    began_wall, began_cpu = time.monotonic(), time.thread_time()
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(units_per_round):
            unit(pool)
        per_unit.append((time.thread_time() - start) / units_per_round)
    fastest, median = min(per_unit), statistics.median(per_unit)
    return {
        "workload": WORKLOAD,
        "units": units_per_round * rounds,
        "rounds": rounds,
        "cpu_seconds_per_unit": fastest,
        "median_cpu_seconds_per_unit": median,
        "median_over_fastest": median / fastest,
        "cpu_seconds": time.thread_time() - began_cpu,
        "wall_seconds": time.monotonic() - began_wall,
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def measure_kernel(
    peer_cpus: Sequence[int] | None, units_per_round: int = KERNEL_UNITS_PER_ROUND, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Answer round trips from a forked asker pinned to peer_cpus; time this thread's CPU per round trip.

    The fastest round counts, as in measure(). The user/system split of this side's time says
    how kernel-bound the unit is on this host.
    """
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        total = units_per_round * (rounds + 1)  # one warm-up round
        asker = os.fork()
        if asker == 0:  # the asking side: k6's place
            try:
                if peer_cpus:
                    os.sched_setaffinity(0, set(peer_cpus))
                _ask(port, total)
            finally:
                os._exit(0)
        connection, _ = listener.accept()
    with connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        response = b"r" * KERNEL_RESPONSE_BYTES
        _answer(connection, response, units_per_round)
        per_unit, user, system = [], 0.0, 0.0
        began_wall = time.monotonic()
        for _ in range(rounds):
            start, usage = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
            _answer(connection, response, units_per_round)
            per_unit.append((time.thread_time() - start) / units_per_round)
            after = resource.getrusage(resource.RUSAGE_THREAD)
            user += after.ru_utime - usage.ru_utime
            system += after.ru_stime - usage.ru_stime
    os.waitpid(asker, 0)
    fastest = min(per_unit)
    return {
        "workload": KERNEL_WORKLOAD,
        "units": units_per_round * rounds,
        "rounds": rounds,
        "cpu_seconds_per_unit": fastest,
        "median_over_fastest": statistics.median(per_unit) / fastest,
        # rusage is charged per tick: a share, good over the whole measurement, not per round.
        "system_share": system / (user + system) if user + system > 0 else None,
        "wall_seconds": time.monotonic() - began_wall,
        "peer_cpus": sorted(peer_cpus) if peer_cpus else None,
    }


def _answer(connection: socket.socket, response: bytes, round_trips: int) -> None:
    for _ in range(round_trips):
        _receive(connection, KERNEL_REQUEST_BYTES)
        connection.sendall(response)


def _ask(port: int, round_trips: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b"q" * KERNEL_REQUEST_BYTES
        for _ in range(round_trips):
            connection.sendall(request)
            _receive(connection, KERNEL_RESPONSE_BYTES)


def _receive(connection: socket.socket, size: int) -> None:
    remaining = size
    while remaining:
        chunk = connection.recv(remaining)
        if not chunk:
            raise ConnectionError("the other side of the kernel calibration closed early")
        remaining -= len(chunk)


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpus_for(scenario: Scenario) -> tuple[int, ...]:
    """The CPUs the local backend pins the scenario's service to (the highest-numbered ones)."""
    return split_cpus(sorted(os.sched_getaffinity(0)), scenario.profile.whole_cpus).service


def run(cpus: Sequence[int], when: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """One calibration in a fresh interpreter pinned to cpus; {"error": ...} when it fails.

    `others_share`: what processes other than the calibration used of all the host's CPUs
    meanwhile (per-CPU /proc/stat), since a busy neighbour, even on another CPU (a hyperthread
    sibling, a shared cache), slows the unit down.
    """
    began = time.monotonic()
    command = [
        sys.executable, "-m", "labrunner.run.calibration", "--cpus", cpu_list(cpus), "--rounds", str(rounds),
    ]  # fmt: skip
    children_before, host_before = _children_cpu_seconds(), interference.read_snapshot()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
        measured: dict[str, Any] = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        stderr = getattr(exc, "stderr", None) or ""
        measured = {"workload": WORKLOAD, "error": f"{type(exc).__name__}: {exc} {stderr[-500:]}".strip()}
    own = _children_cpu_seconds() - children_before
    return {
        "when": when,
        "at": datetime.now(UTC).isoformat(),
        "took_s": round(time.monotonic() - began, 3),
        **measured,
        "others_share": round(interference.others_share(host_before, interference.read_snapshot(), own), 4),
    }


def calibrate(
    cpus: Sequence[int], when: str, say: Say, rounds: int = ROUNDS, attempts: int = CALIBRATION_ATTEMPTS
) -> dict[str, Any]:
    """run() with a line for the user, again (after a pause) while others use more than QUIET_SHARE of
    the host, `attempts` times at most: at the start of a run, the Prometheus and InfluxDB it just
    started are still busy. The result keeps what others used and how many attempts were taken."""
    result, taken = run(cpus, when, rounds), 1
    while taken < attempts and "error" not in result and result["others_share"] > QUIET_SHARE:
        busy = result["others_share"]
        say(f"calibration {when}: others used {busy:.0%} of the host; again in {QUIET_WAIT_S:g} s")
        time.sleep(QUIET_WAIT_S)
        result, taken = run(cpus, when, rounds), taken + 1
    result["attempts"] = taken
    if "error" in result:
        say(f"calibration {when}: failed: {result['error']}")
    else:
        kernel = result["kernel"]
        system = "unknown" if kernel["system_share"] is None else f"{kernel['system_share']:.0%}"
        say(
            f"calibration {when}: CPU unit {result['cpu_seconds_per_unit'] * 1e6:.0f} us, kernel unit "
            f"{kernel['cpu_seconds_per_unit'] * 1e6:.1f} us ({system} system) on CPU(s) "
            f"{cpu_list(result['cpus'])} (median round {result['median_over_fastest']:.2f}x and "
            f"{kernel['median_over_fastest']:.2f}x the fastest; others used {result['others_share']:.1%} "
            "of the host)"
        )
    return result


def unit_seconds(calibration: Mapping[str, Any] | None, unit: str = "cpu") -> float | None:
    """A run's calibration unit ("cpu" or "kernel") in CPU seconds: the mean of its before and after."""
    values = []
    for when in ("before", "after"):
        measured = (calibration or {}).get(when)
        if isinstance(measured, Mapping) and unit == "kernel":
            measured = measured.get("kernel")
        if isinstance(measured, Mapping) and measured.get("cpu_seconds_per_unit"):
            values.append(float(measured["cpu_seconds_per_unit"]))
    return sum(values) / len(values) if values else None


def drift(calibration: Mapping[str, Any] | None) -> float | None:
    """after / before - 1 of one run's calibration; None unless both were measured."""
    before, after = ((calibration or {}).get(when) or {} for when in ("before", "after"))
    if not before.get("cpu_seconds_per_unit") or not after.get("cpu_seconds_per_unit"):
        return None
    return float(after["cpu_seconds_per_unit"]) / float(before["cpu_seconds_per_unit"]) - 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure the calibration workloads' CPU time per unit.")
    parser.add_argument("--cpus", help="pin to these CPUs first, e.g. 1 or 2,3")
    parser.add_argument(
        "--peer-cpus", help="the kernel unit's asking side (default: the other CPUs, else the same)"
    )
    parser.add_argument("--units", type=int, default=UNITS_PER_ROUND, help="units per round")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    available = os.sched_getaffinity(0)
    cpus = {int(cpu) for cpu in args.cpus.split(",")} if args.cpus else available
    peer = {int(cpu) for cpu in args.peer_cpus.split(",")} if args.peer_cpus else (available - cpus or cpus)
    os.sched_setaffinity(0, cpus)
    measured = measure(args.units, args.rounds)
    print(json.dumps({**measured, "kernel": measure_kernel(sorted(peer), rounds=args.rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
