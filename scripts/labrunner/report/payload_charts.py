"""The payload sweep's charts: req/s and CPU per request against response size, and gRPC / REST
against records with the cost model's ratio and crossover."""

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD
from labrunner.report.charts import DPI, FAMILY_COLOURS, family
from labrunner.report.compare import Group
from labrunner.report.payload import PayloadRow
from labrunner.report.payload_sweep import SWEPT, Point, Sweep, body_sizes, size, sweep_groups, sweeps
from labrunner.report.stats import CONFIDENCE
from services.common.stacks import BY_PACKAGE

_AXIS = {"rps": "requests/s (log)", "cpu_per_1k": "CPU seconds per 1,000 requests (log)"}
_RATIO_AXIS = {"rps": "gRPC / REST req/s (log)", "cpu_per_1k": "gRPC / REST CPU per request (log)"}
_WIDTH, _HEIGHT = 11.0, 4.4


def geometric_mean(values: Sequence[float]) -> float:
    """The centre of a group's repeats on these charts (the ratios are of geometric means too)."""
    return math.exp(statistics.fmean(math.log(v) for v in values))


def drawn(
    groups: Sequence[Group], rows: Sequence[PayloadRow], out: Path
) -> list[tuple[Path | None, str, str]]:
    """The sweep's charts in out/ as the report lists them: (path or None, title, caption)."""
    return [
        (
            sweep(groups, rows, out / "payload_sweep.png"),
            "Payload sweep: req/s and CPU per request against response size",
            "points: geometric mean of the repeats, whiskers their range; orange gRPC, blue REST, dashed "
            "TLS; hollow: a lower bound, in no ratio",
        ),
        (
            crossover(sweeps(groups, rows), out / "payload_crossover.png"),
            "Payload crossover: gRPC / REST against records",
            f"points: measured ratio of geometric means, band its {CONFIDENCE:.0%} Welch interval; "
            "dotted: the cost model's ratio of CPU per request (fitted to the paired ratios, else the "
            "lines', where they fit); x: its crossover with its interval",
        ),
    ]


def sweep(groups: Sequence[Group], rows: Sequence[PayloadRow], path: Path) -> Path | None:
    """One row of panels per scenario (sweep_facets): req/s and CPU per request by target against the
    JSON body size of its records."""
    facets, by_shape = sweep_facets(groups, rows)
    if not facets:
        return None
    fig = Figure(figsize=(_WIDTH, _HEIGHT * len(facets) + 0.8), layout="constrained")
    axes = fig.subplots(len(facets), len(SWEPT), squeeze=False)
    for row, ((title, shape), members) in zip(axes, facets.items(), strict=True):
        counts = sorted({g.count for g in members})
        sizes = by_shape[shape]
        for ax, metric in zip(row, SWEPT, strict=True):
            for target in dict.fromkeys(g.target for g in members):
                _target_line(
                    ax,
                    sorted((g for g in members if g.target == target), key=lambda g: g.count),
                    metric,
                    sizes,
                )
            _log_axes(ax, {sizes[c]: _tick(c, sizes) for c in counts}, "JSON body of the same records (log)")
            ax.set_ylabel(_AXIS[metric])
            ax.set_title(title, fontsize="medium")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize="small")
    return _save(fig, path)


def sweep_facets(
    groups: Sequence[Group], rows: Sequence[PayloadRow]
) -> tuple[dict[tuple[str, str], list[Group]], dict[str, dict[int, int]]]:
    """The sweep's groups by scenario (profile, response model or uploads, load model, network, record
    shape), (title, shape) -> groups, each with two counts or more; and each shape's JSON body bytes by
    count (a shape whose bodies payload cannot measure, a --proto run's, has no facet)."""
    swept = sweep_groups(groups)
    swept_counts = {g.count for g in swept}
    by_shape = {
        shape: {n: r.json_bytes for n, r in body_sizes(rows, swept_counts, shape).items()}
        for shape in {g.shape for g in swept}
    }
    facets: dict[tuple[str, str], list[Group]] = {}
    for g in swept:
        if g.results and g.count in by_shape[g.shape]:
            # Uploads and downloads of one target are two lines, never one through both.
            made = "uploads" if g.direction == UPLOAD else g.response_model or "build"
            shape = "" if g.shape == DEFAULT_SHAPE else f", {g.shape}"
            title = f"{g.profile}, {made}, {g.load_model}, {g.network}{shape}"
            facets.setdefault((title, g.shape), []).append(g)
    return {k: v for k, v in facets.items() if len({g.count for g in v}) >= 2}, by_shape


def _target_line(ax: Axes, members: Sequence[Group], metric: str, sizes: Mapping[int, int]) -> None:
    xs, centres, low, high, hollow = [], [], [], [], []
    for g in members:
        values = [v for v in g.values(metric) if v > 0]  # a log axis has no place for 0
        if not values:
            continue
        # The repeats' range: with 2-3 repeats a t interval on the log scale spans decades and hides
        # the lines; the ratios' Welch intervals are in the crossover chart.
        centre = geometric_mean(values)
        xs.append(sizes[g.count])
        centres.append(centre)
        low.append(centre - min(values))
        high.append(max(values) - centre)
        hollow.append(bool(g.lower_bound))
    if not xs:
        return
    first = members[0]
    # One colour per protocol family; within a family the marker (its stack's) names the server, dashes TLS.
    colour = FAMILY_COLOURS[family(first)]
    marker = BY_PACKAGE[first.service].marker
    ax.errorbar(
        xs,
        centres,
        yerr=[low, high],
        color=colour,
        marker=marker,
        linestyle="--" if first.tls else "-",
        capsize=3,
        label=first.target,
    )
    bound_x = [x for x, h in zip(xs, hollow, strict=True) if h]
    bound_y = [y for y, h in zip(centres, hollow, strict=True) if h]
    if bound_x:
        ax.scatter(bound_x, bound_y, s=90, facecolors="white", edgecolors=colour, zorder=3)


def crossover(sweeps: Sequence[Sweep], path: Path) -> Path | None:
    """gRPC / REST per pair against records: the measured ratios with their intervals as a band and,
    for CPU per request, the cost model's ratio and its crossover with its interval; one row of
    panels per direction and record shape."""
    shown = [s for s in sweeps if s.crossover is not None or any(len(s.points[m]) >= 2 for m in SWEPT)]
    if not shown:
        return None
    facets: dict[str, list[Sweep]] = {}
    for s in shown:
        facets.setdefault(s.variant.strip(" ()") or "downloads", []).append(s)
    fig = Figure(figsize=(_WIDTH, _HEIGHT * len(facets) + 0.8), layout="constrained")
    axes = fig.subplots(len(facets), len(SWEPT), squeeze=False)
    legend: dict[str, Artist] = {}
    for row, (title, members) in zip(axes, facets.items(), strict=True):
        counts = sorted({g.count for s in members for g in s.grpc})
        sizes = tick_sizes(members)
        for ax, metric in zip(row, SWEPT, strict=True):
            for s in members:
                _ratio_line(ax, s, metric)
                if metric == "cpu_per_1k":
                    _model_ratio(ax, s)
            ax.axhline(1.0, color="black", linewidth=1)
            xlabel = "records per response (log)" + (", JSON body above" if sizes else "")
            _log_axes(ax, {c: _tick(c, sizes) for c in counts}, xlabel)
            ax.set_ylabel(_RATIO_AXIS[metric])
            ax.set_title(title, fontsize="medium")
            handles, labels = ax.get_legend_handles_labels()
            legend |= dict(zip(labels, handles, strict=True))
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=3, fontsize="small")
    return _save(fig, path)


def _ratio_line(ax: Axes, s: Sweep, metric: str) -> None:
    points: Sequence[Point] = s.points[metric]
    rest = s.rest[0]
    xs = [p.count for p in points]
    # Each line is gRPC against a REST server: drawn in the REST colour, marked as that server.
    ax.plot(
        xs,
        [p.ratio.estimate for p in points],
        color=FAMILY_COLOURS["REST"],
        marker=BY_PACKAGE[rest.service].marker,
        linestyle="--" if rest.tls else "-",
        label=f"{s.grpc_target} / {s.rest_target}",
    )
    if all(p.ratio.low is not None and p.ratio.high is not None for p in points):
        ax.fill_between(
            xs,
            [p.ratio.low or 0.0 for p in points],
            [p.ratio.high or 0.0 for p in points],
            color=FAMILY_COLOURS["REST"],
            alpha=0.06,
            linewidth=0,
        )


def _model_ratio(ax: Axes, s: Sweep) -> None:
    """The cost model's ratio from the fewest records to the most (or to the crossover, when it lies
    beyond them): the ratio model fitted to the paired ratios, else the two lines' ratio, unless a line
    misses its held-out count; and the crossover where it is at a positive count with a bounded interval
    (the paired ratios', the whole sweep's lines' or a segment's)."""
    c = s.crossover
    if c is None or s.grpc_model is None or s.rest_model is None:
        return
    at = c.resolved
    ends = [*c.span] if at is None else [*c.span, at]
    if c.paired is not None:
        _ratio_curve(ax, c.paired.at, ends)
    elif not c.misfit:
        grpc, rest = s.grpc_model.line, s.rest_model.line
        _ratio_curve(ax, lambda n: grpc.at(n) / rest.at(n) if rest.at(n) > 0 else -1.0, ends)
    if at is None:
        return
    error = None
    if c.interval is not None and c.interval[0] > 0:
        error = [[at - c.interval[0]], [c.interval[1] - at]]
    ax.errorbar([at], [1.0], xerr=error, color="black", marker="x", markersize=8, capsize=4)


def _ratio_curve(ax: Axes, ratio: Callable[[float], float], ends: Sequence[float]) -> None:
    """The model's ratio of the two costs, dotted, between the ends."""
    model = [
        (n, r)
        for n in np.geomspace(min(ends), max(ends), 200)
        if (r := ratio(float(n))) > 0  # a log axis has no place for a ratio at or below 0
    ]
    if model:
        records, ratios = zip(*model, strict=True)
        ax.plot(records, ratios, color=FAMILY_COLOURS["REST"], linestyle=":", linewidth=1.5)


def tick_sizes(members: Sequence[Sweep]) -> dict[int, int]:
    """The JSON body bytes at each count as the sweeps' points carry them: the run's payload table, and
    for a count it lacks (300 in the payload preset, whose table has 1, 10, 100 and 1,000) or a shape
    of its own, what payload_sweep measured (body_sizes); none for a shape payload cannot measure."""
    return {
        p.count: p.json_bytes
        for s in members
        for series in s.points.values()
        for p in series
        if p.json_bytes is not None
    }


def _tick(count: int, sizes: Mapping[int, int]) -> str:
    """A count's tick: its JSON body size (where the sweep has it) over its records."""
    return f"{size(sizes[count])}\n{count:,} rec" if count in sizes else f"{count:,} rec"


def _log_axes(ax: Axes, ticks: Mapping[float, str], xlabel: str) -> None:
    """Log axes in plain numbers, x ticked at each count."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(list(ticks), list(ticks.values()))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: _minor_label(ax, value)))
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, which="both")


def _minor_label(ax: Axes, value: float) -> str:
    """Plain numbers between the decades: every one within a decade, 2 and 5 within two, none beyond."""
    low, high = ax.get_ylim()
    decades = math.log10(high / low)
    leading = f"{value:.0e}"[0]
    if decades <= 1 or (decades <= 2.5 and leading in "25"):
        return f"{value:g}"
    return ""


def _save(fig: Figure, path: Path) -> Path:
    """Saved as laid out at construction (constrained: room for the legend below the panels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path
