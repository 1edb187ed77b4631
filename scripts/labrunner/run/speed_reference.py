"""The speed reference: the calibration's CPU unit, run without pause beside the services, so that a
target's own cost can be read at one host speed.

On a cloud VM the host's speed drifts from one block to the next: at an eighth of a CPU the same
server's CPU per request moved 20-40% between 12 s blocks on a 2-vCPU AMD EPYC VM, and both sides of a
duet moved together. A ratio within a block cancels that drift; a target's own level (a payload
sweep's a and b, fitted over blocks) carries it. This process runs the fixed unit of
run.calibration in its own cgroup at REFERENCE_CPUS of a CPU, on the service CPUs, for the whole run;
each measured window reads how much CPU a unit took in it, and a cost divided by that is a cost at one
speed (report.payload_model). Measured in two payload runs on that VM: the log of a window's unit
against the log of a server's cost, both about their group's mean, correlated 0.80 and 0.87 over 134
and 140 windows, and dividing by it took the repeats' median spread from 8.3% to 5.6% and from 13.9%
to 6.3% (docs/measurement.md).

The process writes its count of units and its own thread CPU time into a small shared file after
every unit (COUNTER); read() takes both, and observe.interference reads them around each measured
window. A read that meets a write half done is one unit off, in the thousand or so a window holds.
"""

import argparse
import mmap
import os
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from labrunner import interrupts
from labrunner.backends.cgroups import Cgroup, create_cgroup, enter_limits, remove_cgroup
from labrunner.paths import REPO
from labrunner.run import calibration

# A twentieth of a CPU: about 1,000 units in an 8 s window, and 5% of the CPU the services run on.
REFERENCE_CPUS = 0.05
MEMORY_BYTES = 256 << 20
COUNTER = struct.Struct("<QQ")  # units done, the process's thread CPU nanoseconds
START_TIMEOUT_S = 30.0


class SpeedReference:
    """The reference process: start() puts it in its cgroup on the service's CPUs, stop() removes both;
    read() is None while none runs (before start, after stop: the calibrations' time)."""

    def __init__(self, run_id: str, directory: Path) -> None:
        self.counter_path = directory / f"{run_id}.speed-reference"
        self._cgroup_name = f"{run_id}-speed-reference"
        self._cgroup: Cgroup | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, cpus: Sequence[int]) -> None:
        """Start it pinned to `cpus` and wait for its first unit; OSError (CgroupUnavailable among them)
        or RuntimeError when it cannot run, with nothing left behind."""
        self._cgroup = cgroup = create_cgroup(self._cgroup_name, REFERENCE_CPUS, MEMORY_BYTES)
        try:
            self.counter_path.parent.mkdir(parents=True, exist_ok=True)
            self.counter_path.write_bytes(bytes(COUNTER.size))
            pinned = tuple(cpus)
            with interrupts.held():  # a Ctrl-C inside Popen would leave the child running, unknown
                self._process = process = subprocess.Popen(
                    [sys.executable, "-m", "labrunner.run.speed_reference", str(self.counter_path)],
                    cwd=REPO / "scripts",
                    env={**os.environ, "PYTHONPATH": f"{REPO / 'scripts'}{os.pathsep}{REPO}"},
                    preexec_fn=lambda: enter_limits(cgroup, pinned),  # noqa: PLW1509 (system calls only)
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            while self._counters()[0] == 0:  # its imports and first unit
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the speed reference did not start within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    def read(self) -> tuple[int, int] | None:
        """Units done so far and the CPU nanoseconds they took; None when it is not running."""
        return self._counters() if self._process is not None and self._process.poll() is None else None

    def _counters(self) -> tuple[int, int]:
        units, cpu_ns = COUNTER.unpack(self.counter_path.read_bytes()[: COUNTER.size])
        return units, cpu_ns

    def stop(self) -> None:
        """Kill it and remove its cgroup and file; does nothing when none runs."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None
        if self._cgroup is not None:
            remove_cgroup(self._cgroup)
            self._cgroup = None
        self.counter_path.unlink(missing_ok=True)


def _count(counter_path: Path) -> None:
    """Run units until killed, counting each into the shared file."""
    pool = calibration.records()
    with counter_path.open("r+b") as file, mmap.mmap(file.fileno(), COUNTER.size) as shared:
        units = 0
        while True:
            calibration.unit(pool)
            units += 1
            COUNTER.pack_into(shared, 0, units, time.thread_time_ns())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counter", type=Path)
    _count(parser.parse_args().counter)
