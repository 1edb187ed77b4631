"""Latency under load: p50 and p99 against the offered rate, per target (the latency-throughput curve).

The points are the open-model groups (constant arrival rate, no capacity search: a ladder's rungs,
or any other fixed rate) of one target under the same profile, count, response model and network,
wherever those conditions were offered two or more rates. Streaming targets (a stream of N messages
per iteration) get a chart of their own: their rates are streams/s, not unary calls.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from labrunner.model.questions import is_streaming
from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD
from labrunner.report.cells import centre_cell
from labrunner.report.charts import DPI
from labrunner.report.compare import THROUGHPUT, Group

OPEN_EXECUTOR = "constant-arrival-rate"
PERCENTILES = ("p50", "p99")
_WIDTH, _PANEL_HEIGHT = 11.0, 4.0
_COLOURS = 10  # matplotlib's default cycle, "C0" to "C9": one colour per target
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 2, 5, 20 ms on a log axis, not 2x10^0


@dataclass(frozen=True)
class Conditions:
    """What one curve holds fixed besides its target."""

    streaming: bool
    profile: str
    count: int
    response_model: str
    direction: str
    network: str
    shape: str = DEFAULT_SHAPE

    @property
    def title(self) -> str:
        made = "uploads" if self.direction == UPLOAD else self.response_model or "build"
        parts = [self.profile, f"c{self.count}", made, self.network]
        if self.shape != DEFAULT_SHAPE:
            parts.append(self.shape)
        return ", ".join(parts) + (", streaming" if self.streaming else "")


@dataclass(frozen=True)
class Point:
    """One open-model group: a target at one offered rate."""

    group: Group
    offered: int  # iterations (requests, or streams) per second


def curves(groups: Sequence[Group]) -> dict[Conditions, dict[str, list[Point]]]:
    """Per conditions offered at two or more rates: each target's points, by rising offered rate."""
    found: dict[Conditions, dict[str, list[Point]]] = {}
    for g in groups:
        rate = offered_rate(g)
        if rate is None:
            continue
        conditions = Conditions(
            is_streaming(g), g.profile, g.count, g.response_model, g.direction, g.network, g.shape
        )
        found.setdefault(conditions, {}).setdefault(g.target, []).append(Point(g, rate))
    return {
        conditions: {target: sorted(points, key=lambda p: p.offered) for target, points in by_target.items()}
        for conditions, by_target in found.items()
        if len({p.offered for points in by_target.values() for p in points}) >= 2
    }


def offered_rate(group: Group) -> int | None:
    """The group's offered rate when it is an open-model one with successful repeats, else None."""
    if group.kind != THROUGHPUT or not group.results:
        return None
    model = group.results[0].scenario.load_model
    return int(model.rate) if model.executor == OPEN_EXECUTOR and model.rate else None


def drawn(groups: Sequence[Group], out: Path) -> list[tuple[Path | None, str, str]]:
    """The curves' charts in out/ as the report lists them: (path or None, title, caption)."""
    found = curves(groups)
    caption = (
        "points: the percentile over every repeat's samples at each offered rate (log scale), one line "
        "per target; "
        "dashed: TLS"
    )
    return [
        (
            chart({c: t for c, t in found.items() if not c.streaming}, out / "latency_curve.png"),
            "Latency under load: p50 and p99 against the offered rate, unary targets",
            caption,
        ),
        (
            chart({c: t for c, t in found.items() if c.streaming}, out / "latency_curve_streaming.png"),
            "Latency under load: p50 and p99 of a stream against the offered streams/s",
            caption,
        ),
    ]


def chart(found: Mapping[Conditions, Mapping[str, Sequence[Point]]], path: Path) -> Path | None:
    """One row of panels per conditions: p50 on the left, p99 on the right."""
    if not found:
        return None
    fig = Figure(figsize=(_WIDTH, _PANEL_HEIGHT * len(found) + 0.6), layout="constrained")
    axes = fig.subplots(len(found), len(PERCENTILES), squeeze=False)
    for row, (conditions, by_target) in zip(axes, found.items(), strict=True):
        unit = "streams/s" if conditions.streaming else "requests/s"
        for ax, metric in zip(row, PERCENTILES, strict=True):
            for index, (target, points) in enumerate(by_target.items()):
                drawn_points = [
                    (p.offered, s.centre) for p in points if (s := p.group.summary(metric)) is not None
                ]
                if not drawn_points:
                    continue
                ax.plot(
                    [x for x, _ in drawn_points],
                    [y for _, y in drawn_points],
                    marker="o",
                    color=f"C{index % _COLOURS}",
                    linestyle="--" if points[0].group.tls else "-",
                    label=target,
                )
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_PLAIN)
            ax.yaxis.set_minor_formatter(_PLAIN)
            ax.set_xlim(left=0)
            ax.set_xlabel(f"offered rate, {unit}")
            ax.set_ylabel(f"{metric}, ms (log)")
            ax.set_title(f"{conditions.title}: {metric}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small", ncols=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def rows(groups: Sequence[Group]) -> list[list[str]]:
    """The table's rows: per conditions, target and rising offered rate."""
    out = []
    for conditions, by_target in curves(groups).items():
        for target, points in by_target.items():
            for p in points:
                out.append(
                    [
                        target,
                        conditions.title,
                        str(p.offered),
                        f"{len(p.group.results)}/{p.group.attempted}",
                        *(centre_cell(p.group.summary(m), m) for m in ("rps", "service_cpu", *PERCENTILES)),
                    ]
                )
    return out
