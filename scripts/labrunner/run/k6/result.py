"""A finished k6 run: how its process ended, the summary it wrote, and k6's own CPU use."""

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from labrunner.backends.base import K6Invocation, K6Process
from labrunner.run.k6.output import K6Metrics, parse_summary, read_summary

EXIT_THRESHOLDS_CROSSED = 99  # k6's exit code when a threshold failed (the run itself completed)


@dataclass(frozen=True)
class K6Run:
    """A finished k6 run: how its process ended and the summary its handleSummary wrote."""

    exit_code: int
    summary: Mapping[str, Any] | None  # handleSummary JSON; None when k6 wrote none
    wall_seconds: float
    cpu_seconds: float | None
    cpus: int  # CPUs k6 could use
    output_tail: str
    # k6 split into instances: each instance's own run (segment, CPUs, summary, latency samples);
    # this run merges them (merge.merge_runs: sums, and percentiles over every instance's samples).
    instances: tuple["K6Run", ...] = ()
    segment: str | None = None  # an instance's execution segment
    cpu_ids: tuple[int, ...] = ()  # an instance's CPUs
    placement: str | None = None  # an instance's engine and CPU, when not this host's
    latency_samples: tuple[float, ...] | None = None  # an instance's raw samples of its clock
    merged: K6Metrics | None = None  # a split run's merged numbers
    # An open model's latency in consecutive batches of its samples (k6_stats.batch_percentiles).
    latency_batches: tuple[Mapping[str, float], ...] = ()
    # A duet partner's k6 CPU seconds over the same window, on the same CPUs: k6's CPUs are saturated
    # by the two together, so a side is k6-bound when both k6 processes together used most of them.
    beside_cpu_seconds: float | None = None

    @classmethod
    def collect(cls, process: K6Process, invocation: K6Invocation) -> "K6Run":
        """The run of one k6 process, with the summary its invocation had it write."""
        return cls(
            process.exit_code,
            read_summary(invocation.summary_file),
            process.wall_seconds,
            process.cpu_seconds,
            process.cpus,
            process.output_tail,
            segment=invocation.segment,
            cpu_ids=invocation.cpus or (),
            placement=process.placement,
        )

    @cached_property
    def metrics(self) -> K6Metrics | None:
        """The summary's numbers, parsed once (a split run's: merged); None without a summary."""
        if self.instances:
            return self.merged
        return None if self.summary is None else parse_summary(self.summary)

    @property
    def cpu_utilisation(self) -> float | None:
        """k6's CPU use as a fraction of the CPUs it may use, its duet partner's k6 included (both ran
        on them at once); near 1.0 means k6 saturated.

        Over k6's own test run where the summary has it: the process's wall time also holds
        its start-up (a container's creation under docker), which would read low. A split run
        reports its busiest instance: one saturated instance limits the load it was given.
        """
        if self.instances:
            shares = [run.cpu_utilisation for run in self.instances]
            busiest = None if any(s is None for s in shares) else max(s for s in shares if s is not None)
            return None if busiest is None else busiest + self._beside_share(self.wall_seconds)
        seconds = (self.metrics.test_run_seconds if self.metrics else None) or self.wall_seconds
        if self.cpu_seconds is None or seconds <= 0 or self.cpus <= 0:
            return None
        return self.cpu_seconds / (seconds * self.cpus) + self._beside_share(seconds)

    def _beside_share(self, seconds: float) -> float:
        """The partner's k6 CPU as a share of these CPUs (0 alone)."""
        if self.beside_cpu_seconds is None or seconds <= 0 or self.cpus <= 0:
            return 0.0
        return self.beside_cpu_seconds / (seconds * self.cpus)
