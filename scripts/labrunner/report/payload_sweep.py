"""The payload sweep: gRPC unary against each REST server from 1 to 1,000 records, and where they cross."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from labrunner.report import payload
from labrunner.report.compare import METRICS, THROUGHPUT, Group
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.findings import Finding
from labrunner.report.network import CLOSED, load_kind
from labrunner.report.stats import CONFIDENCE, Ratio, ratio

QUESTION = "payload"
SWEPT = ("cpu_per_1k", "rps")
_LABELS = {"cpu_per_1k": "CPU per request", "rps": "req/s"}
STREAM_SCRIPT = "k6/grpc_stream.js"
# What a sweep holds fixed besides TLS: a gRPC and a REST group pair only within one scenario.
_SAME = ("tls", "profile", "load_model", "response_model", "network", "instrumented")
METHOD = (
    "Sizes are the JSON body of the same records (report/payload.py: exact, no headers, framing or TLS); "
    "the protobuf body at the crossing is interpolated the same way. A crossing is where the ratio "
    "gRPC / REST, interpolated linearly between adjacent counts in log ratio against log bytes, equals "
    f"1; its interval is where the {CONFIDENCE:.0%} Welch intervals of the ratios, carried through "
    "the same interpolation, contain 1 (< or > when it reaches the end of the measured sizes)."
)


@dataclass(frozen=True)
class Point:
    """gRPC / REST for one metric at one count."""

    count: int
    json_bytes: int
    protobuf_bytes: int
    ratio: Ratio


@dataclass(frozen=True)
class Crossing:
    """Where a ratio crosses 1, in JSON body bytes. interval is None without repeats on both sides;
    open_below / open_above: the interval reaches the smallest / largest size measured."""

    json_bytes: float
    records: float
    protobuf_bytes: float
    rising: bool  # gRPC / REST goes from below 1 to above it as responses grow
    interval: tuple[float, float] | None
    open_below: bool = False
    open_above: bool = False


@dataclass(frozen=True)
class Sweep:
    """One gRPC unary target against one REST target at equal TLS and scenario, count by count."""

    grpc: tuple[Group, ...]  # by count, every count both targets ran (usable or not)
    rest: tuple[Group, ...]
    points: Mapping[str, tuple[Point, ...]]  # metric -> points in count order
    left_out: tuple[tuple[str, str], ...]  # ("target cN", why) for groups that enter no ratio

    @property
    def grpc_target(self) -> str:
        return self.grpc[0].target

    @property
    def rest_target(self) -> str:
        return self.rest[0].target

    @property
    def held(self) -> str:
        """What the pair held fixed, in words."""
        g = next((g for g in self.rest if g.results), self.rest[0])
        vus = g.results[0]["scenario"]["load_model"].get("vus") if g.results else None
        load = f"{g.load_model} ({vus} VUs)" if vus else g.load_model
        tls = "TLS" if g.tls else "no TLS"
        return f"{g.profile} profile, {g.response_model or 'build'}, {load}, {g.network}, {tls}"

    def crossings(self, metric: str) -> list[Crossing]:
        return crossings(self.points.get(metric, ()))


def is_unary_grpc(group: Group) -> bool:
    """gRPC with one response per request (a stream is no like-for-like peer of a REST response)."""
    if group.protocol != "grpc":
        return False
    return group.script != STREAM_SCRIPT if group.script else "stream" not in group.target


def sweep_groups(groups: Sequence[Group]) -> list[Group]:
    """The groups a sweep may use: closed-model throughput of REST and unary gRPC targets."""
    return [
        g
        for g in groups
        if g.kind == THROUGHPUT and load_kind(g) == CLOSED and (g.protocol != "grpc" or is_unary_grpc(g))
    ]


def sweeps(groups: Sequence[Group], rows: Sequence[payload.PayloadRow]) -> list[Sweep]:
    """Every (gRPC unary, REST) target pair at equal TLS and scenario that ran at two or more counts.

    Groups without a successful repeat, or whose throughput is only a lower bound, enter no ratio
    (they are listed in left_out); a pair with fewer than two usable counts has no points.
    """
    by_target: dict[tuple[str, tuple[object, ...]], dict[int, Group]] = {}
    for g in sweep_groups(groups):
        by_target.setdefault((g.target, tuple(getattr(g, a) for a in _SAME)), {})[g.count] = g
    pairs = [
        (grpc, rest)
        for (_, key), grpc in by_target.items()
        if next(iter(grpc.values())).protocol == "grpc"
        for (_, rest_key), rest in by_target.items()
        if rest_key == key
        and next(iter(rest.values())).protocol != "grpc"
        and len(grpc.keys() & rest.keys()) >= 2
    ]
    sizes = _sizes(rows, {count for grpc, rest in pairs for count in grpc.keys() & rest.keys()})
    return [_pair(grpc, rest, sizes) for grpc, rest in pairs]


def _pair(
    grpc_by_count: Mapping[int, Group],
    rest_by_count: Mapping[int, Group],
    sizes: Mapping[int, payload.PayloadRow],
) -> Sweep:
    counts = sorted(grpc_by_count.keys() & rest_by_count.keys())
    left_out = []
    usable = []
    for count in counts:
        bad = [g for g in (grpc_by_count[count], rest_by_count[count]) if not g.results or g.lower_bound]
        left_out += [(f"{g.target} c{count}", g.lower_bound or "no successful repeat") for g in bad]
        if not bad:
            usable.append(count)
    points = {}
    for metric in SWEPT:
        series = []
        for count in usable:
            c, b = grpc_by_count[count].values(metric), rest_by_count[count].values(metric)
            # Positive on both sides, or there is no ratio to take the log of.
            if c and b and min(*c, *b) > 0:
                row = sizes[count]
                series.append(Point(count, row.json_bytes, row.protobuf_bytes, ratio(c, b)))
        points[metric] = tuple(series)
    return Sweep(
        grpc=tuple(grpc_by_count[c] for c in counts),
        rest=tuple(rest_by_count[c] for c in counts),
        points=points,
        left_out=tuple(left_out),
    )


def _sizes(rows: Sequence[payload.PayloadRow], counts: set[int]) -> dict[int, payload.PayloadRow]:
    """Body sizes for every count: the run's payload table, measured now for counts it lacks."""
    sizes = {r.count: r for r in rows}
    missing = sorted(counts - set(sizes))
    if missing:
        sizes |= {r.count: r for r in payload.measure(missing)}
    return sizes


def detectable(points: Sequence[Point]) -> bool:
    """Whether any count tells the two apart. When every interval includes 1, wherever the estimates
    cross is noise: no difference is detectable (without repeats nothing is judged, so True)."""
    return any(p.ratio.significant is not False for p in points)


def crossings(points: Sequence[Point]) -> list[Crossing]:
    """Where the ratio's estimate crosses 1 between adjacent points, with its interval.

    On each segment log(ratio) and the logs of its interval's endpoints are linear in log(bytes);
    the interval of a crossing is the connected stretch around it where the interpolated interval
    contains 1. A pointwise band, not a simultaneous one: it says how far the crossing could move
    with each ratio's own uncertainty.
    """
    xs = [math.log(p.json_bytes) for p in points]
    ys = [math.log(p.ratio.estimate) for p in points]
    banded = all(p.ratio.low is not None and p.ratio.high is not None for p in points)
    found = []
    for i in range(len(points) - 1):
        if (ys[i] < 0) == (ys[i + 1] < 0):
            continue
        t = ys[i] / (ys[i] - ys[i + 1])
        x = xs[i] + t * (xs[i + 1] - xs[i])
        interval, below, above = _band_around(points, xs, i, t) if banded else (None, False, False)
        found.append(
            Crossing(
                json_bytes=math.exp(x),
                records=_interpolate(x, xs, [math.log(p.count) for p in points]),
                protobuf_bytes=_interpolate(x, xs, [math.log(p.protobuf_bytes) for p in points]),
                rising=ys[i] < 0,
                interval=interval,
                open_below=below,
                open_above=above,
            )
        )
    return found


def _band_around(
    points: Sequence[Point], xs: Sequence[float], segment: int, t: float
) -> tuple[tuple[float, float], bool, bool]:
    """The stretch around (segment, t) where the interpolated interval contains 1, in bytes."""
    spans = [_contains_one(points[i].ratio, points[i + 1].ratio) for i in range(len(points) - 1)]
    span = spans[segment]
    # The estimate lies inside its interval, so the crossing's own segment contains it.
    assert span is not None and span[0] <= t <= span[1]
    first, start = segment, span[0]
    while start == 0.0 and first > 0 and (previous := spans[first - 1]) is not None and previous[1] == 1.0:
        first, start = first - 1, previous[0]
    last, end = segment, span[1]
    while (
        end == 1.0
        and last < len(spans) - 1
        and (following := spans[last + 1]) is not None
        and following[0] == 0.0
    ):
        last, end = last + 1, following[1]
    low = xs[first] + start * (xs[first + 1] - xs[first])
    high = xs[last] + end * (xs[last + 1] - xs[last])
    below = first == 0 and start == 0.0
    above = last == len(spans) - 1 and end == 1.0
    return (math.exp(low), math.exp(high)), below, above


def _contains_one(a: Ratio, b: Ratio) -> tuple[float, float] | None:
    """The share t in [0, 1] of a segment where the interpolated interval contains 1."""
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    # log low <= 0 and log high >= 0, each linear in t.
    low_side = _where(math.log(a.low), math.log(b.low), below=True)
    high_side = _where(math.log(a.high), math.log(b.high), below=False)
    if low_side is None or high_side is None:
        return None
    start, end = max(low_side[0], high_side[0]), min(low_side[1], high_side[1])
    return (start, end) if start <= end else None


def _where(y0: float, y1: float, below: bool) -> tuple[float, float] | None:
    """Where (1 - t) y0 + t y1 is <= 0 (below) or >= 0 (not below), for t in [0, 1]."""
    inside0, inside1 = (y0 <= 0, y1 <= 0) if below else (y0 >= 0, y1 >= 0)
    if inside0 and inside1:
        return (0.0, 1.0)
    if not inside0 and not inside1:
        return None
    root = y0 / (y0 - y1)
    return (0.0, root) if inside0 else (root, 1.0)


def _interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """exp of ys linearly interpolated at x (all in logs)."""
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            t = (x - xs[i]) / (xs[i + 1] - xs[i])
            return math.exp(ys[i] + t * (ys[i + 1] - ys[i]))
    raise ValueError("x outside the points")


def findings(groups: Sequence[Group], rows: Sequence[payload.PayloadRow]) -> list[Finding]:
    """One finding per (gRPC, REST) pair, then the body sizes; [] for a run with one count."""
    pairs = sweeps(groups, rows)
    if not pairs:
        return []
    counts = sorted({g.count for s in pairs for g in (*s.grpc, *s.rest)})
    return [_pair_finding(s) for s in pairs] + size_findings([r for r in rows if r.count in counts])


def _pair_finding(s: Sweep) -> Finding:
    label = f"{s.grpc_target} vs {s.rest_target}"
    if not all(len(s.points[m]) >= 2 for m in SWEPT):
        usable = sorted({p.count for m in SWEPT for p in s.points[m]})
        return Finding(
            QUESTION,
            f"{label}: no crossover computed, fewer than two counts usable "
            f"({', '.join(f'c{c}' for c in usable) or 'none'}); {s.held}",
            caveat=_left_out(s),
        )
    parts = [_metric_clause(m, s.points[m], crossings(s.points[m])) for m in SWEPT]
    significant = [abs(math.log(p.ratio.estimate)) for m in SWEPT for p in s.points[m] if p.ratio.significant]
    caveats = [_left_out(s)] if s.left_out else []
    if any(p.ratio.significant is None for m in SWEPT for p in s.points[m]):
        caveats.append("one repeat on a side: no interval")
    suspect = [g for g in (*s.grpc, *s.rest) if any(r.get("suspect") for r in g.results)]
    if suspect:
        caveats.append(f"{len(suspect)} of {len(s.grpc) + len(s.rest)} groups with suspect repeats")
    return Finding(
        QUESTION,
        f"{label}: " + "; ".join(parts) + f"; {s.held}",
        effect=max(significant, default=0.0),
        caveat="; ".join(caveats),
    )


def _metric_clause(metric: str, points: Sequence[Point], found: Sequence[Crossing]) -> str:
    """E.g. "CPU per request crosses at 2.1 KB of JSON [1.2 KB, 3.5 KB] (about 11 records, protobuf
    0.9 KB), gRPC / REST 1.40x at 1, 0.62x at 1,000"."""
    span = f"between {points[0].count:,} and {points[-1].count:,} records"
    if not detectable(points):
        return f"{_LABELS[metric]}: no difference detectable {span} ({_ends(points, intervals=True)})"
    if not found:
        return f"{_LABELS[metric]}: no crossing {span} ({_ends(points, intervals=True)})"
    where = " and again at ".join(_crossing(c) for c in found)
    return f"{_LABELS[metric]} crosses at {where}, {_ends(points, intervals=False)}"


def _ends(points: Sequence[Point], intervals: bool) -> str:
    """The ratio at the first and the last count, with its interval if asked and there is one."""
    parts = []
    for p in (points[0], points[-1]):
        r = p.ratio
        text = f"{r.estimate:.2f}x"
        if intervals and r.low is not None and r.high is not None:
            text += f" [{r.low:.2f}, {r.high:.2f}]"
        parts.append(f"{text} at {p.count:,}")
    return "gRPC / REST " + ", ".join(parts)


def _crossing(c: Crossing) -> str:
    text = f"{size(c.json_bytes)} of JSON"
    if c.interval is None:
        text += " (no interval: one repeat)"
    else:
        low = f"<{size(c.interval[0])}" if c.open_below else size(c.interval[0])
        high = f">{size(c.interval[1])}" if c.open_above else size(c.interval[1])
        text += f" [{low}, {high}]"
    return text + f" (about {c.records:.0f} records, protobuf {size(c.protobuf_bytes)})"


# (how the two bodies are encoded, protobuf's size, JSON's size): PayloadRow attributes.
_SIZE_PAIRS = (
    ("raw", "protobuf_bytes", "json_bytes"),
    ("gzip", "protobuf_gzip_bytes", "json_gzip_bytes"),
    ("raw protobuf against gzip JSON", "protobuf_bytes", "json_gzip_bytes"),
)


def size_findings(rows: Sequence[payload.PayloadRow]) -> list[Finding]:
    """Where protobuf bodies stop or start being smaller than JSON, raw and gzip: exact sizes of the
    same records, so without intervals."""
    if len(rows) < 2:
        return []
    rows = sorted(rows, key=lambda r: r.count)
    counts = ", ".join(f"{r.count:,}" for r in rows)
    held = f"body bytes of the same records, gzip level {payload.GZIP_LEVEL}, no headers, framing or TLS"
    out = []
    for name, protobuf_field, json_field in _SIZE_PAIRS:
        points = [
            Point(
                r.count,
                r.json_bytes,
                r.protobuf_bytes,
                _exact(getattr(r, protobuf_field) / getattr(r, json_field)),
            )
            for r in rows
        ]
        ratios = [p.ratio.estimate for p in points]
        span = " to ".join(
            f"{size(getattr(r, protobuf_field))} against {size(getattr(r, json_field))}"
            for r in (rows[0], rows[-1])
        )
        found = crossings(points)
        if found:
            where = " and ".join(
                f"{size(c.json_bytes)} of JSON (about {c.records:.0f} records; protobuf "
                + ("larger" if c.rising else "smaller")
                + " above)"
                for c in found
            )
            verdict = f"crosses 1 at {where}"
        else:
            smaller = "smaller" if ratios[0] < 1 else "larger"
            verdict = (
                f"protobuf {smaller} at every count, "
                f"no crossing between {rows[0].count:,} and {rows[-1].count:,} records"
            )
        sentence = (
            f"protobuf / JSON, {name}: {', '.join(f'{v:.2f}x' for v in ratios)} at {counts} records "
            f"({span}); {verdict}; {held}"
        )
        out.append(Finding(QUESTION, sentence, effect=max(abs(math.log(v)) for v in ratios)))
    return out


def section(groups: Sequence[Group], rows: Sequence[payload.PayloadRow]) -> list[Block]:
    """The report's "Payload sweep" section; [] unless a pair ran at two or more counts."""
    pairs = sweeps(groups, rows)
    if not pairs:
        return []
    rows_out = []
    for s in pairs:
        by_count = {m: {p.count: p for p in s.points[m]} for m in SWEPT}
        for count in sorted({p.count for m in SWEPT for p in s.points[m]}):
            point = next(by_count[m][count] for m in SWEPT if count in by_count[m])
            rows_out.append(
                [
                    s.grpc_target,
                    s.rest_target,
                    f"{count:,}",
                    size(point.json_bytes),
                    size(point.protobuf_bytes),
                    *(_cell(by_count[m].get(count)) for m in SWEPT),
                ]
            )
    crossing_rows = []
    for s in pairs:
        for m in SWEPT:
            if len(s.points[m]) < 2:
                crossing_rows.append([s.grpc_target, s.rest_target, _LABELS[m], "not computed", "-"])
                continue
            found = s.crossings(m)
            span = f"between {s.points[m][0].count:,} and {s.points[m][-1].count:,} records"
            if not detectable(s.points[m]):
                found, text = [], f"no difference detectable {span}"
            else:
                text = "; ".join(_crossing(c) for c in found) or f"none {span}"
            # Below 1 is gRPC's side for CPU per request, above 1 for req/s.
            direction = "; ".join(
                "gRPC ahead below" if c.rising != METRICS[m].higher_is_better else "gRPC ahead above"
                for c in found
            )
            crossing_rows.append([s.grpc_target, s.rest_target, _LABELS[m], text, direction or "-"])
    left_out = sorted({f"{label}: {why}" for s in pairs for label, why in s.left_out})
    blocks: list[Block] = [
        Heading(2, "Payload sweep: where protobuf pays off"),
        Paragraph(
            "gRPC unary against each REST server at equal TLS, profile, response model and load model, "
            "from the fewest to the most records the run measured. Ratios are gRPC / REST (geometric means "
            f"of the repeats, Welch {CONFIDENCE:.0%} intervals): below 1 gRPC uses less CPU per request, "
            "above 1 it serves more req/s. " + METHOD
        ),
        table(
            ("gRPC", "REST", "records", "JSON body", "protobuf body", "CPU / req ratio", "req/s ratio"),
            rows_out,
            (False, False, True, True, True, True, True),
        ),
        Paragraph("Crossings (JSON body bytes of the same records):"),
        table(("gRPC", "REST", "metric", "crossing [interval]", "side"), crossing_rows, (False,) * 5),
    ]
    if left_out:
        blocks.append(Paragraph("Left out of the ratios: " + "; ".join(f"`{r}`" for r in left_out) + "."))
    return blocks


def size(value: float) -> str:
    """Bytes in B, KB or MB (1 KB = 1,000 B), two or three significant figures."""
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _cell(p: Point | None) -> str:
    if p is None:
        return "-"
    r = p.ratio
    if r.low is None or r.high is None:
        return f"{r.estimate:.2f}x ({r.note})"
    mark = "" if r.significant else " not significant"
    return f"{r.estimate:.2f}x [{r.low:.2f}, {r.high:.2f}]{mark}"


def _exact(value: float) -> Ratio:
    """A ratio of exact sizes: its interval is the point."""
    return Ratio(value, value, value, 1.0 if value == 1 else 0.0, value != 1)


def _left_out(s: Sweep) -> str:
    return "left out (lower bound or no successful repeat): " + ", ".join(label for label, _ in s.left_out)
