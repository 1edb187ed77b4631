"""Docker stats parsed into the service's usage over the measured window, and k6's CPU sampled
until its containers exit."""

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import httpx
from docker.models.containers import Container

from labrunner.backends.base import ServiceHandle, ServiceUsage, delta

_K6_POLL_S = 0.5
_METRICS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StatsSnapshot:
    """The fields of one `docker stats` sample that a scenario's usage is computed from."""

    cpu_ns: int | None
    periods: int | None
    throttled_periods: int | None
    throttled_ns: int | None
    memory_max_usage: int | None  # cgroup v1 only; v2 engines leave it out
    memory_limit: int | None
    user_ns: int | None = None  # cpu_ns split into user and kernel mode
    kernel_ns: int | None = None

    @classmethod
    def parse(cls, stats: Mapping[str, Any]) -> "StatsSnapshot":
        cpu = stats.get("cpu_stats") or {}
        throttling = cpu.get("throttling_data") or {}
        memory = stats.get("memory_stats") or {}
        usage = cpu.get("cpu_usage") or {}
        return cls(
            cpu_ns=usage.get("total_usage"),
            periods=throttling.get("periods"),
            throttled_periods=throttling.get("throttled_periods"),
            throttled_ns=throttling.get("throttled_time"),
            memory_max_usage=memory.get("max_usage"),
            memory_limit=memory.get("limit"),
            user_ns=usage.get("usage_in_usermode"),
            kernel_ns=usage.get("usage_in_kernelmode"),
        )


@dataclass(frozen=True)
class UsageWindow:
    """The service's stats at the start and end of the measured k6 run."""

    before: StatsSnapshot
    after: StatsSnapshot
    wall_seconds: float
    memory_peak_metric: int | None  # protolab_cgroup_memory_peak_bytes, read when stats lack a peak


def usage_from_stats(
    window: UsageWindow | None, cpu_limit_cores: float, exit_code: int | None, log_tail: str
) -> ServiceUsage:
    """The service's usage over the measured window from the stats taken at its start and end."""
    if window is None:
        return ServiceUsage.unmeasured(exit_code, log_tail)
    before, after = window.before, window.after
    throttled_ns = delta(before.throttled_ns, after.throttled_ns)
    cpu_ns = delta(before.cpu_ns, after.cpu_ns)
    peak = after.memory_max_usage if after.memory_max_usage is not None else window.memory_peak_metric
    return ServiceUsage(
        window_seconds=window.wall_seconds,
        cpu_seconds=None if cpu_ns is None else cpu_ns / 1e9,
        cpu_limit_cores=cpu_limit_cores,
        cpu_periods=delta(before.periods, after.periods),
        throttled_periods=delta(before.throttled_periods, after.throttled_periods),
        throttled_seconds=None if throttled_ns is None else throttled_ns / 1e9,
        memory_peak_bytes=peak,
        # Docker cannot reset the peak, but the container is as old as the scenario.
        memory_peak_scope="lifetime" if peak is not None else None,
        memory_limit_bytes=after.memory_limit,
        exit_code=exit_code,
        log_tail=log_tail,
        user_cpu_seconds=_seconds(delta(before.user_ns, after.user_ns)),
        system_cpu_seconds=_seconds(delta(before.kernel_ns, after.kernel_ns)),
    )


def _seconds(nanoseconds: int | None) -> float | None:
    return None if nanoseconds is None else nanoseconds / 1e9


def memory_peak_from_metrics(text: str) -> int | None:
    """protolab_cgroup_memory_peak_bytes from a /metrics page."""
    match = re.search(r"^protolab_cgroup_memory_peak_bytes (\S+)$", text, re.MULTILINE)
    return None if match is None else int(float(match[1]))


def memory_peak(handle: ServiceHandle) -> int | None:
    if handle.metrics_address is None:
        return None
    try:
        response = httpx.get(f"http://{handle.metrics_address}/metrics", timeout=_METRICS_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return memory_peak_from_metrics(response.text) if response.status_code == 200 else None


def stats(container: Container) -> StatsSnapshot:
    # one_shot: the current counters now, instead of waiting a second for a CPU percentage.
    # stream=False returns the one decoded sample; the stubs give both modes one return type.
    return StatsSnapshot.parse(cast("dict[str, Any]", container.stats(stream=False, one_shot=True)))


def cpu_until_all_exit(containers: Sequence[Container]) -> list[int | None]:
    """Each k6 container's CPU nanoseconds: an exited container has no stats, so sample until it exits.

    The last sample is at most one poll interval (times the containers) before the exit, so up to
    that much k6 CPU goes uncounted; a stopped container reports zero, hence the maximum.
    """
    cpu_ns: list[int | None] = [None] * len(containers)
    running = list(range(len(containers)))
    while running:
        for index in list(running):
            container = containers[index]
            if sample := stats(container).cpu_ns:
                cpu_ns[index] = max(cpu_ns[index] or 0, sample)
            container.reload()
            if container.status != "running":
                running.remove(index)
        if running:
            time.sleep(_K6_POLL_S)
    return cpu_ns
