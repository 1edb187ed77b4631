"""Whether this kernel's task clock runs while the hypervisor steals the CPU, from its configuration.

With CONFIG_PARAVIRT_TIME_ACCOUNTING the scheduler's task clock leaves stolen time out, so a
process's CPU time (rusage, cgroup usage) excludes steal; without it, stolen time is charged to
whatever was running. interference.py uses this to compute what others took; a window whose own
CPU time exceeds what the CPUs ran is observed evidence that the task clock included steal.
"""

import functools
import gzip
import platform
from dataclasses import dataclass
from pathlib import Path

OPTION = "CONFIG_PARAVIRT_TIME_ACCOUNTING"


@dataclass(frozen=True)
class StealClock:
    """includes_steal: whether a task's CPU time includes time stolen from it (None: unknown)."""

    includes_steal: bool | None
    source: str


def from_kernel_config(text: str | None) -> StealClock:
    """The answer a kernel's .config gives."""
    if text is None:
        return StealClock(None, "kernel configuration not readable")
    for line in text.splitlines():
        if line.startswith(f"{OPTION}="):
            value = line.split("=", 1)[1].strip()
            return StealClock(value != "y", f"kernel config {OPTION}={value}")
        if line.strip() == f"# {OPTION} is not set":
            return StealClock(True, f"kernel config: {OPTION} is not set")
    return StealClock(True, f"kernel config has no {OPTION} (no paravirtual steal accounting)")


def read_kernel_config(release: str | None = None, root: Path = Path("/")) -> str | None:
    """/proc/config.gz, else /boot/config-<release>; None when neither can be read."""
    try:
        return gzip.decompress((root / "proc/config.gz").read_bytes()).decode()
    except (OSError, EOFError, gzip.BadGzipFile):
        pass
    try:
        return (root / f"boot/config-{release or platform.release()}").read_text()
    except OSError:
        return None


@functools.cache
def this_kernel() -> StealClock:
    """This host's answer, read once per process."""
    return from_kernel_config(read_kernel_config())
