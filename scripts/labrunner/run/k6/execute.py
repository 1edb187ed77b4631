"""Run k6 where the backend runs it, all of a split run's instances together, and read what it wrote."""

from collections.abc import Sequence
from dataclasses import replace

from labrunner.backends.base import Backend, K6Invocation, K6Process, ServiceHandle
from labrunner.run.k6.merge import merge_runs
from labrunner.run.k6.output import DEFAULT_LATENCY_METRIC, take_latency_samples
from labrunner.run.k6.result import K6Run
from labrunner.run.k6_stats import batch_percentiles


def execute(backend: Backend, handle: ServiceHandle, invocation: K6Invocation, measured: bool) -> K6Run:
    """The finished run of an invocation; a split one's instances merged (merge_runs)."""
    if invocation.instances:
        return _execute_split(backend, handle, invocation.instances, measured)
    invocation.summary_file.unlink(missing_ok=True)  # a stale summary must not pass for this run's
    run = K6Run.collect(backend.run_k6(handle, invocation, measured), invocation)
    if invocation.raw_file is None:
        return run
    samples = take_latency_samples(invocation.raw_file, _clock(run))
    return replace(run, latency_batches=batch_percentiles(samples))


def _execute_split(
    backend: Backend, handle: ServiceHandle, instances: Sequence[K6Invocation], measured: bool
) -> K6Run:
    """Every instance started together and waited for together, then merged."""
    for instance in instances:  # stale output must not pass for this run's
        instance.summary_file.unlink(missing_ok=True)
        if instance.raw_file is not None:
            instance.raw_file.unlink(missing_ok=True)
    processes = backend.run_k6_instances(handle, instances, measured)
    return merge_runs([_instance_run(p, i) for p, i in zip(processes, instances, strict=True)])


def _instance_run(process: K6Process, instance: K6Invocation) -> K6Run:
    """An instance's run, with the samples of the clock its summary names when it wrote raw output."""
    run = K6Run.collect(process, instance)
    if instance.raw_file is None:
        return run
    return replace(run, latency_samples=tuple(take_latency_samples(instance.raw_file, _clock(run))))


def _clock(run: K6Run) -> str:
    """The latency metric the run's summary names (the default when it wrote none)."""
    return run.metrics.latency_metric if run.metrics else DEFAULT_LATENCY_METRIC
