"""k6 on the local backend: one process per invocation, all started together, each pinned to its
own CPUs (in the client's namespace on a network scenario), their CPU seconds from wait4; after a
Ctrl-C, each let stop gracefully, then killed."""

import functools
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.backends.base import BackendSettings, K6Invocation, K6Process, tail_file
from labrunner.backends.local.limits import enter_k6_cpus
from labrunner.backends.local.usage import wait_all_with_usage, wait_with_usage
from labrunner.network.namespaces import exec_prefix

K6_INHERITED_ENV = ("PATH", "HOME", "TMPDIR")
_K6_INTERRUPT_GRACE_S = 10.0


@dataclass(frozen=True)
class K6Runs:
    """k6's processes of one run_k6_instances, ended."""

    invocations: Sequence[K6Invocation]
    cpus: tuple[int, ...]  # the handle's k6 CPUs, for an invocation that names none
    offsets: Sequence[int]  # each log's size before: its tail is this run's
    processes: Sequence[tuple[subprocess.Popen[bytes], float]]  # each with when it started
    ended: Sequence[tuple[float, float]]  # each one's CPU seconds (wait4) and when it ended
    wall_seconds: float  # from before the first start to after the last end

    def results(self, relay_cpu_seconds: float | None) -> tuple[K6Process, ...]:
        """Each invocation's K6Process; the userspace link emulator's CPU over the whole run is the
        same window for every instance."""
        single = len(self.processes) == 1
        return tuple(
            K6Process(
                exit_code=process.returncode,
                wall_seconds=self.wall_seconds if single else end - began,
                cpu_seconds=cpu_seconds,
                cpus=len(invocation.cpus or self.cpus),
                output_tail=tail_file(invocation.log_file, offset=offset),
                relay_cpu_seconds=relay_cpu_seconds,
            )
            for (process, began), (cpu_seconds, end), invocation, offset in zip(
                self.processes, self.ended, self.invocations, self.offsets, strict=True
            )
        )


def run_k6(
    settings: BackendSettings,
    invocations: Sequence[K6Invocation],
    cpus: tuple[int, ...],
    namespace: str | None,
) -> K6Runs:
    """Start one k6 per invocation (on its CPUs, else on `cpus`; in `namespace` when one is given) and
    wait for them all."""
    env = {k: os.environ[k] for k in K6_INHERITED_ENV if k in os.environ}
    offsets = [inv.log_file.stat().st_size if inv.log_file.exists() else 0 for inv in invocations]
    prefix = exec_prefix(namespace) if namespace is not None else []
    started = time.monotonic()
    processes: list[tuple[subprocess.Popen[bytes], float]] = []
    try:
        for invocation in invocations:
            with invocation.log_file.open("ab") as log:
                process = subprocess.Popen(
                    [*prefix, *invocation.command(settings.k6_binary)],
                    cwd=settings.root,
                    env=env | dict(invocation.env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Set before exec: Go starts its threads early and they keep the mask they see.
                    preexec_fn=functools.partial(enter_k6_cpus, invocation.cpus or cpus),  # noqa: PLW1509
                )
            processes.append((process, time.monotonic()))
        if len(processes) == 1:
            ended = [(wait_with_usage(processes[0][0]), time.monotonic())]
        else:
            ended = wait_all_with_usage([process for process, _ in processes])
    finally:
        for process, _ in processes:
            _reap_interrupted(process)
    wall = time.monotonic() - started
    return K6Runs(invocations, cpus, offsets, processes, ended, wall)


def _reap_interrupted(process: subprocess.Popen[bytes]) -> None:
    """After Ctrl-C k6 is still finishing: let it stop gracefully, then kill it."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=_K6_INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
