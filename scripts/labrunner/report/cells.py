"""Table cells of the report: numbers, intervals and ratios formatted one way everywhere."""

from labrunner.report.stats import Ratio, Summary, ratio_too_wide, summary_too_wide

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
    """'**1.21x** [1.06, 1.38] significant', or '—' with why (no interval, or one too wide to judge)."""
    if r.significant is None:
        return f"{r.estimate:.2f}x ({r.note})"
    if wide := ratio_too_wide(r):
        return f"— ({wide})"
    interval = f"[{r.low:.2f}, {r.high:.2f}]"
    return (
        f"**{r.estimate:.2f}x** {interval} significant"
        if r.significant
        else f"{r.estimate:.2f}x {interval} not significant"
    )


def centre_cell(s: Summary | None, metric: str) -> str:
    """The group's geometric mean (stats.CENTRE)."""
    return fmt(s.centre if s else None, metric_format(metric))


def interval_cell(s: Summary | None, metric: str) -> str:
    if s is None:
        return "-"
    return interval_text(s, metric_format(metric))


def interval_text(s: Summary, spec: str) -> str:
    """A group's interval '[1.2, 1.5]'; its note without one; '—' with why when it is too wide to use."""
    if s.low is None or s.high is None:
        return s.note
    if wide := summary_too_wide(s):
        return f"— ({wide})"
    return f"[{spec.format(s.low)}, {spec.format(s.high)}]"


def centre_interval_cells(s: Summary, spec: str) -> list[str]:
    """n, the geometric mean and its interval, the smallest and the largest repeat."""
    return [
        str(s.n),
        spec.format(s.centre),
        interval_text(s, spec),
        spec.format(s.minimum),
        spec.format(s.maximum),
    ]


def metric_format(metric: str) -> str:
    return FORMATS.get(metric, LATENCY_FORMAT)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def left_first(count: int, total: int) -> tuple[bool, ...]:
    return tuple(i >= count for i in range(total))
