"""The report's PNG charts, drawn with matplotlib's object API (no pyplot state, no display needed)."""

from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from labrunner.model.questions import is_streaming
from labrunner.report.compare import CAPACITY, SEQUENTIAL, THROUGHPUT, Group
from labrunner.report.payload import PayloadRow
from labrunner.report.serialization import Case
from labrunner.report.stats import CENTRE, CONFIDENCE, Ratio, summarize

DPI = 100
# The caption of every chart of bars with whiskers over repeats.
WHISKERS = f"bars: {CENTRE} of the repeats; whiskers: its {CONFIDENCE:.0%} log-scale interval; dots: repeats"
_WIDTH = 11.0
_FACET_HEIGHT = 3.4
_BAR_SPACE = 0.8  # share of each x slot the bars of one slot fill


# One colour per protocol family on every chart.
FAMILY_COLOURS = {"REST": "#4c72b0", "gRPC": "#dd8452"}
PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9")
_CLOSED = ("constant-vus", "ramping-vus")
_OPEN = ("constant-arrival-rate",)


def family(group: Group) -> str:
    return "gRPC" if group.protocol == "grpc" else "REST"


def throughput(groups: Sequence[Group], path: Path) -> Path | None:
    """Requests/s of the saturating (closed-model) groups by target, one panel per profile, payload and
    load model, bars coloured by protocol family."""
    facets = _facets(_saturating(groups), lambda g: f"{g.profile}, c{g.count}, {g.load_model}")
    return _by_family(facets, "rps", "requests/s", path)


def efficiency(groups: Sequence[Group], path: Path) -> Path | None:
    """Service CPU seconds per 1,000 successful requests of the saturating groups; streaming targets
    (a stream of N messages per iteration) in a panel of their own, so the unary bars keep their scale."""
    facets = _facets(
        _saturating(groups),
        lambda g: f"{g.profile}, c{g.count}, {g.load_model}" + (", streaming" if is_streaming(g) else ""),
    )
    return _by_family(facets, "cpu_per_1k", "CPU seconds per 1,000 requests", path)


def latency(groups: Sequence[Group], path: Path) -> Path | None:
    """The latency percentile spectrum (p50 to p99.9) of each target under an open model, one line per
    target at the percentiles pooled over its repeats, as far as its samples support, log scale."""
    wanted = [g for g in groups if g.kind == THROUGHPUT and g.results and _executor(g) in _OPEN]
    facets = _facets(wanted, lambda g: f"{g.profile}, c{g.count}, {g.load_model}")
    if not facets:
        return None
    fig, axes = _figure(len(facets))
    markers = "osD^vP*X"
    for ax, (title, members) in zip(axes, facets.items(), strict=True):
        for index, g in enumerate(members):
            # Only the percentiles the pooled samples support (stats.MIN_SAMPLES_BEYOND).
            points = [(p, s.centre) for p in PERCENTILES if g.supports(p) and (s := g.summary(p))]
            ax.plot(
                [p for p, _ in points],
                [centre for _, centre in points],
                marker=markers[index % len(markers)],
                color=FAMILY_COLOURS[family(g)],
                linestyle="--" if g.tls else "-",
                label=g.target,
            )
        ax.set_yscale("log")
        ax.set_ylabel("latency, ms (log)")
        ax.set_title(f"{title}: an equal offered load every target carried")
        ax.legend(fontsize="small", ncols=2)
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def sequential(groups: Sequence[Group], path: Path) -> Path | None:
    """Mean latency of one client sending N requests in sequence, by target, one bar per N."""
    wanted = [g for g in groups if g.kind == SEQUENTIAL and g.results]
    facets = _facets(wanted, lambda g: f"{g.profile}, c{g.count}")
    return _by_target(facets, "avg", "mean latency, ms", lambda g: f"N={g.iterations}", path)


def capacity(groups: Sequence[Group], path: Path) -> Path | None:
    """p99 against the offered rate for every step of every search, with the SLO."""
    wanted = [g for g in groups if g.kind == CAPACITY and g.results]
    facets = _facets(wanted, lambda g: f"{g.profile}, c{g.count}")
    if not facets:
        return None
    fig, axes = _figure(len(facets))
    for ax, (title, members) in zip(axes, facets.items(), strict=True):
        slo = None
        for g in members:
            for result in g.results:
                search = result.capacity
                if search is None:
                    continue
                slo = search.slo_p99_ms
                # (rate, p99, passed) of each step that measured its p99, by rate
                steps = sorted((s.rate, s.p99_ms, s.passed) for s in search.steps if s.p99_ms is not None)
                label = f"{g.target} r{result.scenario.repeat}"
                line = ax.plot([s[0] for s in steps], [s[1] for s in steps], marker="o", label=label)
                failed = [s for s in steps if not s[2]]
                ax.scatter(
                    [s[0] for s in failed],
                    [s[1] for s in failed],
                    marker="x",
                    s=60,
                    color=line[0].get_color(),
                )
        if slo is not None:
            ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate, requests/s")
        ax.set_ylabel("p99, ms (log)")
        ax.set_title(title)
        ax.legend(fontsize="small")
    return _save(fig, path)


def payload_bytes(groups: Sequence[Group], rows: Sequence[PayloadRow], path: Path) -> Path | None:
    """Left: what k6 received per response, by target. Right: body bytes by encoding and count."""
    measured = [g for g in groups if g.kind == THROUGHPUT and g.values("bytes")]
    if not measured and not rows:
        return None
    fig = Figure(figsize=(_WIDTH, 4.2))
    left, right = fig.subplots(1, 2)
    if measured:
        facets = _facets(measured, lambda g: f"c{g.count}")
        labels = [f"{g.target} ({title})" for title, members in facets.items() for g in members]
        values = [summarize(g.values("bytes")).centre for members in facets.values() for g in members]
        left.barh(labels, values, color="#4c72b0")
        left.invert_yaxis()
        left.set_xlabel("bytes received per response (geometric mean), headers and framing included")
        left.tick_params(axis="y", labelsize="small")
    left.set_title("on the wire (k6 data_received / requests)")
    if rows:
        counts = [r.count for r in rows]
        for attribute, label in (
            ("json_bytes", "JSON"),
            ("json_gzip_bytes", "JSON gzip"),
            ("protobuf_bytes", "protobuf"),
            ("protobuf_gzip_bytes", "protobuf gzip"),
        ):
            right.plot(counts, [getattr(r, attribute) for r in rows], marker="o", label=label)
        right.set_xscale("log")
        right.set_yscale("log")
        right.set_xlabel("records per response")
        right.set_ylabel("body bytes")
        right.legend(fontsize="small")
    right.set_title("body size by encoding")
    return _save(fig, path)


def serialization(cases: Sequence[Case], path: Path) -> Path | None:
    """Microseconds per operation by record count, one bar per codec and operation at the geometric mean,
    whiskers its log-scale interval."""
    if not cases:
        return None
    counts = sorted({c.count for c in cases})
    keys = list(dict.fromkeys(f"{c.codec} {c.operation}" for c in cases))
    width = _BAR_SPACE / len(keys)
    fig = Figure(figsize=(_WIDTH, 4.2))
    ax = fig.subplots()
    for index, key in enumerate(keys):
        members = [c for c in cases if f"{c.codec} {c.operation}" == key]
        xs = [counts.index(c.count) - _BAR_SPACE / 2 + width * (index + 0.5) for c in members]
        centres = [c.geomean_us for c in members]
        ax.bar(xs, centres, width * 0.9, label=key)
        lower = [c.geomean_us - c.low_us if c.low_us is not None else 0.0 for c in members]
        upper = [c.high_us - c.geomean_us if c.high_us is not None else 0.0 for c in members]
        ax.errorbar(xs, centres, yerr=[lower, upper], fmt="none", ecolor="black", capsize=2, linewidth=1)
    ax.set_xticks(range(len(counts)), [f"{c} record{'s' if c != 1 else ''}" for c in counts])
    ax.set_yscale("log")
    ax.set_ylabel("microseconds per operation (geometric mean, log)")
    ax.legend(fontsize="small", ncols=3)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


_RATIO_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def forest(rows: Sequence[tuple[str, Ratio]], path: Path) -> Path | None:
    """The findings at a glance: each pair's ratio as a point with its interval on a log axis, 1 marked;
    a ratio without an interval is a hollow point. None without a row."""
    if not rows:
        return None
    fig = Figure(figsize=(_WIDTH, 0.9 + 0.36 * len(rows)))
    ax = fig.subplots()
    for y, (_, r) in enumerate(reversed(rows)):
        if r.low is not None and r.high is not None:
            ax.plot([r.low, r.high], [y, y], color="#333333", linewidth=1.5)
            ax.plot([r.estimate], [y], "o", color="#4c72b0" if r.significant else "#999999")
        else:
            ax.plot([r.estimate], [y], "o", markerfacecolor="none", color="#999999")
    ax.axvline(1.0, color="#c44e52", linewidth=1, linestyle="--")
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ax.set_xticks([t for t in _RATIO_TICKS if low <= t <= high], minor=False)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)])
    ax.set_xlabel(
        "ratio (log scale): candidate / baseline, 95% interval; blue: significant, as the lines judge it"
    )
    ax.grid(axis="x", which="both", alpha=0.3)
    return _save(fig, path)


def _with_values(facets: dict[str, list[Group]], metric: str) -> dict[str, list[Group]]:
    """Each facet's groups that have values of metric; facets left empty are dropped."""
    kept = {title: [g for g in members if g.values(metric)] for title, members in facets.items()}
    return {title: members for title, members in kept.items() if members}


def _by_target(
    facets: dict[str, list[Group]], metric: str, ylabel: str, hue: Callable[[Group], str], path: Path
) -> Path | None:
    facets = _with_values(facets, metric)
    if not facets:
        return None
    fig, axes = _figure(len(facets))
    for ax, (title, members) in zip(axes, facets.items(), strict=True):
        targets = list(dict.fromkeys(g.target for g in members))
        hues = list(dict.fromkeys(hue(g) for g in members))
        series: dict[str, list[list[float]]] = {h: [[] for _ in targets] for h in hues}
        for g in members:
            series[hue(g)][targets.index(g.target)] = g.values(metric)
        _grouped_bars(ax, targets, series)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    return _save(fig, path)


def _by_family(facets: dict[str, list[Group]], metric: str, ylabel: str, path: Path) -> Path | None:
    """One bar per target at the geometric mean, whiskers its log-scale interval, a dot per repeat,
    coloured by protocol family."""
    facets = _with_values(facets, metric)
    if not facets:
        return None
    fig, axes = _figure(len(facets))
    for ax, (title, members) in zip(axes, facets.items(), strict=True):
        for slot, g in enumerate(members):
            values = g.values(metric)
            s = summarize(values)
            low = s.centre - s.low if s.low is not None else 0.0
            high = s.high - s.centre if s.high is not None else 0.0
            ax.bar(slot, s.centre, _BAR_SPACE * 0.9, color=FAMILY_COLOURS[family(g)])
            ax.errorbar(
                slot, s.centre, yerr=[[low], [high]], fmt="none", ecolor="black", capsize=3, linewidth=1
            )
            ax.scatter([slot] * len(values), values, s=8, color="black", zorder=3)
        ax.set_xticks(
            range(len(members)), [g.target for g in members], rotation=20, ha="right", fontsize="small"
        )
        handles = [Patch(color=colour, label=name) for name, colour in FAMILY_COLOURS.items()]
        ax.legend(handles=handles, fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        # Log scale: the intervals are log-scale ones, and a wide one (few repeats) leaves the bars
        # of the main comparison readable.
        ax.set_yscale("log")
        ax.set_ylabel(f"{ylabel} (log)")
        ax.set_title(title)
    return _save(fig, path)


def _saturating(groups: Sequence[Group]) -> list[Group]:
    """Closed-model throughput groups: where req/s and CPU per request are the service's capacity."""
    return [g for g in groups if g.kind == THROUGHPUT and g.results and _executor(g) in _CLOSED]


def _executor(group: Group) -> str:
    return group.results[0].scenario.load_model.executor if group.results else ""


def _grouped_bars(ax: Axes, labels: Sequence[str], series: dict[str, list[list[float]]]) -> None:
    """Bars at the geometric mean, whiskers for its log-scale interval (stats.summarize), a dot per repeat."""
    width = _BAR_SPACE / max(1, len(series))
    for index, (name, per_label) in enumerate(series.items()):
        xs, heights, low, high, dots_x, dots_y = [], [], [], [], [], []
        for slot, values in enumerate(per_label):
            if not values:
                continue
            x = slot - _BAR_SPACE / 2 + width * (index + 0.5)
            s = summarize(values)
            xs.append(x)
            heights.append(s.centre)
            low.append(s.centre - s.low if s.low is not None else 0.0)
            high.append(s.high - s.centre if s.high is not None else 0.0)
            dots_x += [x] * len(values)
            dots_y += list(values)
        ax.bar(xs, heights, width * 0.9, label=name)
        ax.errorbar(xs, heights, yerr=[low, high], fmt="none", ecolor="black", capsize=3, linewidth=1)
        ax.scatter(dots_x, dots_y, s=8, color="black", zorder=3)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize="small")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)


def _facets(groups: Sequence[Group], key: Callable[[Group], str]) -> dict[str, list[Group]]:
    facets: dict[str, list[Group]] = {}
    for g in groups:
        facets.setdefault(key(g), []).append(g)
    return facets


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(_WIDTH, _FACET_HEIGHT * panels + 0.6))
    axes = fig.subplots(panels, 1, squeeze=False)
    return fig, [row[0] for row in axes]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path
