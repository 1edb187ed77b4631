"""A run split into k6 instances, merged into one: counts summed, latency over every instance's
samples (never an average of percentiles), the worst exit code."""

from collections.abc import Sequence

from labrunner.backends.base import ScenarioFailed
from labrunner.run.k6.output import DEFAULT_LATENCY_METRIC, K6Metrics
from labrunner.run.k6.result import EXIT_THRESHOLDS_CROSSED, K6Run
from labrunner.run.k6_stats import merged_latency


def merge_runs(runs: Sequence[K6Run]) -> K6Run:
    """One run from its instances, which it keeps as its `instances`."""
    cpu = [run.cpu_seconds for run in runs]
    return K6Run(
        exit_code=merge_exit_codes([run.exit_code for run in runs]),
        summary=None,
        wall_seconds=max(run.wall_seconds for run in runs),
        cpu_seconds=None if any(c is None for c in cpu) else sum(c for c in cpu if c is not None),
        cpus=sum(run.cpus for run in runs),
        output_tail="\n".join(
            f"[k6 instance {i} of {len(runs)}, segment {run.segment}]\n{run.output_tail}"
            for i, run in enumerate(runs, start=1)
        ),
        instances=tuple(runs),
        merged=_merged_metrics(runs),
    )


def _merged_metrics(runs: Sequence[K6Run]) -> K6Metrics | None:
    """The instances' numbers as one run's; None when an instance wrote no summary."""
    metrics = [run.metrics for run in runs]
    if any(m is None for m in metrics):
        return None
    return merge_metrics([m for m in metrics if m is not None], _all_samples(runs))


def _all_samples(runs: Sequence[K6Run]) -> list[float] | None:
    """Every instance's samples of its clock; None when an instance has none (no raw output).

    ScenarioFailed when an instance's raw output does not hold one sample per sample its summary
    counts: the merged percentiles would not be over all samples.
    """
    samples: list[float] = []
    for index, run in enumerate(runs, start=1):
        if run.latency_samples is None:
            return None
        metrics = run.metrics
        assert metrics is not None, "merged only when every instance has a summary"
        if len(run.latency_samples) != metrics.latency_count:
            raise ScenarioFailed(
                "measure",
                f"k6 instance {index}: its raw output holds {len(run.latency_samples)} "
                f"{metrics.latency_metric} samples, its summary {metrics.latency_count}",
                run.output_tail,
            )
        samples.extend(run.latency_samples)
    return samples


def merge_metrics(metrics: Sequence[K6Metrics], samples: Sequence[float] | None) -> K6Metrics:
    """Instances' numbers as one run's: counts summed, rates over the longest instance's test run,
    latency over every instance's samples (k6_stats.merged_latency)."""
    requests = sum(m.requests for m in metrics)
    attempts = sum(m.attempts for m in metrics)
    errors = sum(m.errors for m in metrics)
    received = sum(m.data_received_bytes for m in metrics)
    durations = [m.test_run_seconds for m in metrics if m.test_run_seconds is not None]
    seconds = max(durations) if durations else None
    latency, grid = merged_latency([(m.latency_ms, m.requests) for m in metrics], samples)
    vus = [m.vus_max for m in metrics if m.vus_max is not None]
    return K6Metrics(
        requests=requests,
        requests_per_second=requests / seconds if seconds else sum(m.requests_per_second for m in metrics),
        attempts=attempts,
        errors=errors,
        error_rate=errors / attempts if attempts else None,
        latency_ms=latency,
        latency_metric=metrics[0].latency_metric if metrics else DEFAULT_LATENCY_METRIC,
        latency_count=sum(m.latency_count for m in metrics),
        latency_quantiles_ms=grid,
        data_received_bytes=received,
        data_received_bytes_per_second=received / seconds
        if seconds
        else sum(m.data_received_bytes_per_second for m in metrics),
        dropped_iterations=sum(m.dropped_iterations for m in metrics),
        iterations=sum(m.iterations for m in metrics),
        checks_passed=sum(m.checks_passed for m in metrics),
        checks_failed=sum(m.checks_failed for m in metrics),
        vus_max=sum(vus) if vus else None,
        test_run_seconds=seconds,
        failed_thresholds=tuple(sorted({t for m in metrics for t in m.failed_thresholds})),
        connections_opened=sum(m.connections_opened for m in metrics),
    )


def merge_exit_codes(codes: Sequence[int]) -> int:
    """0 when every instance succeeded; else a failure's code before crossed thresholds' (99)."""
    failures = [code for code in codes if code != 0]
    hard = [code for code in failures if code != EXIT_THRESHOLDS_CROSSED]
    return (hard or failures or [0])[0]
