"""Table cells of the report: numbers, intervals and ratios formatted one way everywhere."""

from labrunner.report.stats import Ratio, Summary

FORMATS = {
    "rps": "{:.1f}",
    "cpu_per_1k": "{:.3f}",
    "bytes": "{:.0f}",
    "service_cpu": "{:.0%}",
    "k6_cpu": "{:.0%}",
    "seconds": "{:.2f}",
    "sustainable": "{:.0f}",
}
LATENCY_FORMAT = "{:.2f}"


def ratio_cell(r: Ratio) -> str:
    if r.significant is None:
        return f"{r.estimate:.2f}x ({r.note})"
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    return (
        f"**{r.estimate:.2f}x** {interval} significant"
        if r.significant
        else f"{r.estimate:.2f}x {interval} not significant"
    )


def median_cell(s: Summary | None, metric: str) -> str:
    return fmt(s.median if s else None, metric_format(metric))


def interval_cell(s: Summary | None, metric: str) -> str:
    if s is None:
        return "-"
    if s.ci_low is None or s.ci_high is None:
        return "n/a: one repeat"
    spec = metric_format(metric)
    return f"[{spec.format(s.ci_low)}, {spec.format(s.ci_high)}]"


def bdn_cells(s: Summary, spec: str) -> list[str]:
    return bdn_value_cells(s.n, s.mean, s.error, s.stddev, s.median, spec=spec)


def bdn_value_cells(
    n: int, mean: float, error: float | None, stddev: float | None, median: float, *, spec: str
) -> list[str]:
    return [str(n), spec.format(mean), fmt(error, spec), fmt(stddev, spec), spec.format(median)]


def metric_format(metric: str) -> str:
    return FORMATS.get(metric, LATENCY_FORMAT)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def left_first(count: int, total: int) -> tuple[bool, ...]:
    return tuple(i >= count for i in range(total))
