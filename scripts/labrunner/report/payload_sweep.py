"""The payload sweep: gRPC unary against each REST server from 1 to 1,000 records, and where the CPU
per request of the two crosses.

The answer comes from a cost model (report/payload_model.py): each target's CPU per request fitted
as a + b·n over all its counts and repeats, checked by predicting a count the fit did not see, and the
crossover fitted to the rounds' paired ratios (or solved from the two lines with Fieller's interval
where a run has too few). It replaced a crossing interpolated
between adjacent counts in (log bytes, log ratio), which placed the crossover 15-30% low on exact
affine costs (the ratio of two affine costs is S-shaped in log n) and judged it from whether one
count alone told the two apart. The measured ratios by count stay in the section as the evidence.
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from labrunner.model.scenario import DEFAULT_SHAPE, UPLOAD
from labrunner.report import payload, payload_model
from labrunner.report.compare import THROUGHPUT, Group, paired_rounds, partners, round_ratio
from labrunner.report.network import CLOSED, load_kind
from labrunner.report.payload_model import CostModel, Crossover, Estimate, scaled
from labrunner.report.stats import Ratio

SWEPT = ("cpu_per_1k", "rps")
STREAM_SCRIPT = "k6/grpc_stream.js"
# What a sweep holds fixed besides TLS: a gRPC and a REST group pair only within one scenario.
_SAME = ("tls", "profile", "load_model", "response_model", "direction", "shape", "network", "instrumented")
FORMAT_ALONE = {"encode": "encoding alone", "decode": "decoding alone"}  # by payload_model.operation


@dataclass(frozen=True)
class Point:
    """gRPC / REST for one metric at one count."""

    count: int
    json_bytes: int | None  # None for a shape whose bodies cannot be measured (payload.measurable)
    protobuf_bytes: int | None
    ratio: Ratio


@dataclass(frozen=True)
class Sweep:
    """One gRPC unary target against one REST target at equal TLS and scenario, count by count."""

    grpc: tuple[Group, ...]  # by count, every count both targets ran (usable or not)
    rest: tuple[Group, ...]
    points: Mapping[str, tuple[Point, ...]]  # metric -> measured ratios in count order
    left_out: tuple[tuple[str, str], ...]  # ("target cN", why) for groups that enter no ratio
    grpc_model: CostModel | None  # None with fewer than two counts to fit
    rest_model: CostModel | None
    # The speed reference's CPU per unit the models' costs are read at (payload_model.at_speed); None:
    # as measured (no speed reference beside every repeat).
    speed: float | None = None

    @property
    def grpc_target(self) -> str:
        return self.grpc[0].target

    @property
    def rest_target(self) -> str:
        return self.rest[0].target

    @property
    def shape(self) -> str:
        """The record shape both sides served (_SAME)."""
        return self.rest[0].shape

    @property
    def variant(self) -> str:
        """What tells the pair from another sweep of the same targets in a table or legend:
        " (uploads, numeric)", "" for downloads of the default shape."""
        uploads = ["uploads"] if self.direction == UPLOAD else []
        parts = [*uploads, *([self.shape] if self.shape != DEFAULT_SHAPE else [])]
        return f" ({', '.join(parts)})" if parts else ""

    @property
    def scenario(self) -> str:
        """What the pair held fixed besides TLS, in words: the shape only when not the default."""
        shape = "" if self.shape == DEFAULT_SHAPE else f", {self.shape} records"
        return self.conditions + shape

    @property
    def conditions(self) -> str:
        """What the pair held fixed besides TLS and the record shape, in words."""
        g = next((g for g in self.rest if g.results), self.rest[0])
        vus = g.results[0].scenario.load_model.vus if g.results else None
        load = f"{g.load_model} ({vus} VUs)" if vus else g.load_model
        made = "uploads" if g.direction == UPLOAD else g.response_model or "build"
        return f"{g.profile} profile, {made}, {load}, {g.network}"

    @property
    def direction(self) -> str:
        """Which way the records travel: one direction per pair (_SAME)."""
        return self.rest[0].direction

    @property
    def operation(self) -> str:
        """What the servers do with the format per record: "encode" (downloads) or "decode" (uploads)."""
        return payload_model.operation(self.direction)

    @property
    def held(self) -> str:
        """What the pair held fixed, in words."""
        return f"{self.scenario}, {self._tls}"

    @property
    def held_but_shape(self) -> str:
        """What the pair held fixed besides the record shape, in words."""
        return f"{self.conditions}, {self._tls}"

    @property
    def _tls(self) -> str:
        return "TLS" if self.rest[0].tls else "no TLS"

    @functools.cached_property
    def crossover(self) -> Crossover | None:
        """Where the two costs cross (payload_model.crossover, from the rounds' paired ratios where they
        suffice); None without both cost models."""
        if self.grpc_model is None or self.rest_model is None:
            return None
        return payload_model.crossover(self.grpc_model, self.rest_model, self.round_ratios)

    @property
    def round_ratios(self) -> tuple[tuple[int, float], ...]:
        """(records, gRPC / REST CPU per request) of every round both sides ran at a count: a duet
        block's two sides are one round."""
        return tuple(
            (grpc.count, ours / theirs)
            for grpc, rest in zip(self.grpc, self.rest, strict=True)
            for ours, theirs in paired_rounds(grpc, rest, payload_model.CPU)
            if min(ours, theirs) > 0
        )


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


def sweeps(groups: Sequence[Group], rows: Sequence[payload.PayloadRow] | None) -> list[Sweep]:
    """Every (gRPC unary, REST) target pair at equal TLS and scenario that ran at two or more counts.

    In a duet run a target has one group per partner at each count: a pair takes the groups that ran
    beside each other (compare.partners), so that its rounds are the blocks both sides shared, and
    neither the other pair's blocks nor the A/A control's enter it. Groups without a successful repeat,
    or whose throughput is only a lower bound, enter no ratio (they are listed in left_out); the cost
    models fit every group with a CPU per request. rows: the run's body sizes (body_sizes); None for
    none (--precision reads only the crossovers).
    """
    by_target: dict[tuple[str, str | None, tuple[object, ...]], dict[int, Group]] = {}
    for g in sweep_groups(groups):
        by_target.setdefault((g.target, g.partner, tuple(getattr(g, a) for a in _SAME)), {})[g.count] = g
    pairs = [
        (grpc, rest)
        for (_, _, key), grpc in by_target.items()
        if _first(grpc).protocol == "grpc"
        for (_, _, rest_key), rest in by_target.items()
        if rest_key == key
        and _first(rest).protocol != "grpc"
        and partners(_first(grpc), _first(rest))
        and len(grpc.keys() & rest.keys()) >= 2
    ]
    counts = {count for grpc, rest in pairs for count in grpc.keys() & rest.keys()}
    shapes = {_shape(rest) for _, rest in pairs}
    sizes = {shape: body_sizes(rows, counts, shape) if rows is not None else {} for shape in shapes}
    # One speed for every model of the run, so that lines fitted apart meet at one scale.
    speed = payload_model.reference_speed(g for pair in pairs for side in pair for g in side.values())
    return [_pair(grpc, rest, sizes[_shape(rest)], speed) for grpc, rest in pairs]


def _first(by_count: Mapping[int, Group]) -> Group:
    return next(iter(by_count.values()))


def _shape(by_count: Mapping[int, Group]) -> str:
    return _first(by_count).shape


def _pair(
    grpc_by_count: Mapping[int, Group],
    rest_by_count: Mapping[int, Group],
    sizes: Mapping[int, payload.PayloadRow],
    speed: float | None,
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
                row = sizes.get(count)
                json_bytes, protobuf_bytes = (row.json_bytes, row.protobuf_bytes) if row else (None, None)
                paired = round_ratio(grpc_by_count[count], rest_by_count[count], metric)
                series.append(Point(count, json_bytes, protobuf_bytes, paired))
        points[metric] = tuple(series)
    grpc = tuple(grpc_by_count[c] for c in counts)
    rest = tuple(rest_by_count[c] for c in counts)
    return Sweep(
        grpc=grpc,
        rest=rest,
        points=points,
        left_out=tuple(left_out),
        grpc_model=payload_model.fit_target(grpc, speed),
        rest_model=payload_model.fit_target(rest, speed),
        speed=speed,
    )


def body_sizes(
    rows: Sequence[payload.PayloadRow], counts: set[int], shape: str
) -> dict[int, payload.PayloadRow]:
    """Body sizes of `shape`'s records for every count: the run's payload table (the default shape's),
    measured now for what it lacks; none for a shape payload.measure does not know (a --proto run's)."""
    sizes = {r.count: r for r in rows} if shape == DEFAULT_SHAPE else {}
    missing = sorted(counts - set(sizes))
    if missing:
        sizes |= {r.count: r for r in payload.measure(missing, shape)}
    return sizes


def fitted(pairs: Sequence[Sweep]) -> list[tuple[CostModel, list[tuple[Group, Group]]]]:
    """Every target's cost model once per scenario (target, Sweep.held), gRPC first, in pair order, at
    the run's one speed, with the groups it fitted: each beside the group of the other side it ran with
    (its duet partner's, or its pair's at that count in a sequential run), so that gRPC in a duet run
    has the blocks beside every REST server."""
    sides: dict[tuple[str, str], dict[int, tuple[Group, Group]]] = {}
    for s in pairs:
        for own, other in ((s.grpc, s.rest), (s.rest, s.grpc)):
            for g, beside in zip(own, other, strict=True):
                sides.setdefault((g.target, s.held), {})[id(g)] = (g, beside)
    speed = pairs[0].speed if pairs else None
    found = []
    for members in sides.values():
        model = payload_model.fit_target([g for g, _ in members.values()], speed)
        if model is not None:
            found.append((model, list(members.values())))
    return found


def models(pairs: Sequence[Sweep]) -> list[CostModel]:
    """Every target's cost model once per scenario (fitted)."""
    return [model for model, _ in fitted(pairs)]


def interval(e: Estimate, sign: str = "", scale: float = 1000, digits: int = 2) -> str:
    """value [low, high] times scale (by default ms to µs), or the value alone without an interval."""
    return scaled(e, scale).text(f"{{:{sign}.{digits}f}}")


def size(value: float) -> str:
    """Bytes in B, KB or MB (1 KB = 1,000 B), two or three significant figures."""
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"
