"""The payload sweep: gRPC unary against each REST server from 1 to 1,000 records, and where the CPU
per request of the two crosses.

The answer comes from a cost model (report/payload_model.py): each target's CPU per request fitted
as a + b·n over all its counts and repeats, the crossover solved from the two lines with Fieller's
interval, and checked by predicting a count the fit did not see. It replaced a crossing interpolated
between adjacent counts in (log bytes, log ratio), which placed the crossover 15-30% low on exact
affine costs (the ratio of two affine costs is S-shaped in log n) and judged it from whether one
count alone told the two apart. The measured ratios by count stay in the section as the evidence.
"""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from labrunner.model.scenario import UPLOAD
from labrunner.report import payload, payload_model
from labrunner.report.compare import THROUGHPUT, Group
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.findings import Finding
from labrunner.report.network import CLOSED, load_kind
from labrunner.report.payload_model import CostModel, Crossover, Estimate, Line
from labrunner.report.serialization import Case
from labrunner.report.stats import CONFIDENCE, Ratio, ratio
from labrunner.results.trust import SERVICE_CPU_BOUND

QUESTION = "payload"
SWEPT = ("cpu_per_1k", "rps")
STREAM_SCRIPT = "k6/grpc_stream.js"
# What a sweep holds fixed besides TLS: a gRPC and a REST group pair only within one scenario.
_SAME = ("tls", "profile", "load_model", "response_model", "direction", "shape", "network", "instrumented")
NO_BENCHMARK = "No serialization benchmark in this run (serialization.json): no encoding-alone figures."
FORMAT_ALONE = {"encode": "encoding alone", "decode": "decoding alone"}  # by payload_model.operation


@dataclass(frozen=True)
class Point:
    """gRPC / REST for one metric at one count."""

    count: int
    json_bytes: int
    protobuf_bytes: int
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

    @property
    def grpc_target(self) -> str:
        return self.grpc[0].target

    @property
    def rest_target(self) -> str:
        return self.rest[0].target

    @property
    def scenario(self) -> str:
        """What the pair held fixed besides TLS, in words."""
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
        return f"{self.scenario}, {'TLS' if self.rest[0].tls else 'no TLS'}"

    @property
    def crossover(self) -> Crossover | None:
        """Where the two cost lines meet; None without both."""
        if self.grpc_model is None or self.rest_model is None:
            return None
        return payload_model.crossover(self.grpc_model, self.rest_model)


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
    (they are listed in left_out); the cost models fit every group with a CPU per request.
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
    grpc = tuple(grpc_by_count[c] for c in counts)
    rest = tuple(rest_by_count[c] for c in counts)
    return Sweep(
        grpc=grpc,
        rest=rest,
        points=points,
        left_out=tuple(left_out),
        grpc_model=payload_model.fit_target(grpc),
        rest_model=payload_model.fit_target(rest),
    )


def _sizes(rows: Sequence[payload.PayloadRow], counts: set[int]) -> dict[int, payload.PayloadRow]:
    """Body sizes for every count: the run's payload table, measured now for counts it lacks."""
    sizes = {r.count: r for r in rows}
    missing = sorted(counts - set(sizes))
    if missing:
        sizes |= {r.count: r for r in payload.measure(missing)}
    return sizes


def findings(
    groups: Sequence[Group], rows: Sequence[payload.PayloadRow], cases: Sequence[Case] = ()
) -> list[Finding]:
    """Per (gRPC, REST) pair its crossover and, with the serialization benchmark's cases, how much of
    the per-record difference is the format; then the model's check and the body sizes. [] for a run
    with one count."""
    pairs = sweeps(groups, rows)
    if not pairs:
        return []
    found = [_pair_finding(s) for s in pairs]
    found += [f for s in pairs if (f := _format_finding(s, _format_lines(s, cases))) is not None]
    models = _models(pairs)
    if models:
        found.append(Finding(QUESTION, payload_model.held_out_sentence(models) + "."))
    counts = sorted({g.count for s in pairs for g in (*s.grpc, *s.rest)})
    return found + size_findings([r for r in rows if r.count in counts])


def _pair_finding(s: Sweep) -> Finding:
    """E.g. "grpc vs aiohttp-h1, CPU per request: crosses at 40 records [31, 52], gRPC cheaper above;
    gRPC +0.20 ms/request, -5.0 µs/record."; what the pair held fixed beside it."""
    label = f"{s.grpc_target} vs {s.rest_target}"
    crossover = s.crossover
    if s.grpc_model is None or s.rest_model is None or crossover is None:
        return Finding(
            QUESTION,
            f"{label}, CPU per request: no cost model, fewer than two counts have one.",
            caveat=_caveat(s),
            held_fixed=s.held,
        )
    grpc, rest = s.grpc_model.line, s.rest_model.line
    fixed = grpc.fixed.value - rest.fixed.value
    per_record = grpc.per_record.value - rest.per_record.value
    significant = [abs(math.log(p.ratio.estimate)) for m in SWEPT for p in s.points[m] if p.ratio.significant]
    return Finding(
        QUESTION,
        f"{label}, CPU per request: {payload_model.crossover_text(crossover)}; "
        f"gRPC {fixed:+.2f} ms/request, {per_record * 1000:+.1f} µs/record.",
        effect=max(significant, default=0.0),
        answer=True,
        caveat=_caveat(s),
        held_fixed=s.held,
    )


def _caveat(s: Sweep) -> str:
    models = [m for m in (s.grpc_model, s.rest_model) if m is not None]
    caveats = []
    idle = [f"{m.target} c{i.count} at {i.utilisation:.0%}" for m in models for i in m.idle]
    if idle:
        caveats.append(f"below {SERVICE_CPU_BOUND:.0%} of the quota, idle CPU in the cost: {', '.join(idle)}")
    missing = [f"{m.target} c{count}" for m in models for count in m.missing]
    if missing:
        caveats.append(f"no CPU per request: {', '.join(missing)}")
    suspect = [g for g in (*s.grpc, *s.rest) if any(r.suspect for r in g.results)]
    if suspect:
        caveats.append(f"{len(suspect)} of {len(s.grpc) + len(s.rest)} groups with suspect repeats")
    return "; ".join(caveats)


def _format_lines(s: Sweep, cases: Sequence[Case]) -> dict[str, Line]:
    """The benchmark's lines of the operation the pair's servers do per record: encode for a download,
    decode for an upload."""
    return payload_model.format_lines(cases, s.direction)


def _format_finding(s: Sweep, encodings: Mapping[str, Line]) -> Finding | None:
    """E.g. "grpc vs aiohttp-h1, per record: gRPC -5.00 [-5.40, -4.60] µs against REST; encoding alone
    -0.60 µs (protobuf 0.30, orjson 0.90): 12% of it the format, the rest the server."; "decoding alone"
    for an upload, from the benchmark's decode times (encodings: _format_lines of the pair)."""
    if s.grpc_model is None or s.rest_model is None:
        return None
    split = payload_model.per_record_split(s.grpc_model.line, s.rest_model.line, encodings)
    if split is None:
        return None
    share = split.format_share
    if share is None:
        verdict = "the servers' per-record costs are not told apart"
    else:
        verdict = f"{share:.0%} of it the format, the rest the server"
    if share is not None and share < 0:  # the format pulls the other way: the servers are the rest
        server = (split.servers.value - split.encoding) * 1000
        verdict = f"the format favours the other side, so the servers differ by {server:+.2f} µs"
    protobuf, orjson = (_per_record(encodings[codec]) for codec in ("protobuf", "orjson"))
    return Finding(
        QUESTION,
        f"{s.grpc_target} vs {s.rest_target}, per record: gRPC {_interval(split.servers, '+')} µs against "
        f"REST; {FORMAT_ALONE[s.operation]} {split.encoding * 1000:+.2f} µs (protobuf {protobuf}, "
        f"orjson {orjson}): "
        f"{verdict}.",
        held_fixed=s.held,
        answer=True,
    )


def _models(pairs: Sequence[Sweep]) -> list[CostModel]:
    """Every target's cost model once per scenario, gRPC first, in pair order."""
    models: dict[tuple[str, str], CostModel] = {}
    for s in pairs:
        for model in (s.grpc_model, s.rest_model):
            if model is not None:
                models.setdefault((model.target, s.held), model)
    return list(models.values())


def _per_record(line: Line) -> str:
    return f"{line.per_record.value * 1000:.2f}"


# (how the two bodies are encoded, protobuf's size, JSON's size): PayloadRow attributes.
_SIZE_PAIRS = (
    ("raw", "protobuf_bytes", "json_bytes"),
    ("gzip", "protobuf_gzip_bytes", "json_gzip_bytes"),
    ("raw protobuf against gzip JSON", "protobuf_bytes", "json_gzip_bytes"),
)


@dataclass(frozen=True)
class SizeCrossing:
    """Where protobuf's body size equals JSON's between two counts."""

    records: float
    json_bytes: float  # the raw JSON body there
    protobuf_larger_above: bool


def size_crossings(
    rows: Sequence[payload.PayloadRow], protobuf_field: str, json_field: str
) -> list[SizeCrossing]:
    """Where the two sizes cross, linear in records between adjacent counts: sizes are exact and
    near affine in records, as the costs are."""
    found = []
    for low, high in itertools.pairwise(rows):
        before = getattr(low, protobuf_field) - getattr(low, json_field)
        after = getattr(high, protobuf_field) - getattr(high, json_field)
        if (before < 0) != (after < 0):
            t = before / (before - after)
            found.append(
                SizeCrossing(
                    records=low.count + t * (high.count - low.count),
                    json_bytes=low.json_bytes + t * (high.json_bytes - low.json_bytes),
                    protobuf_larger_above=before < 0,
                )
            )
    return found


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
        ratios = [getattr(r, protobuf_field) / getattr(r, json_field) for r in rows]
        span = " to ".join(
            f"{size(getattr(r, protobuf_field))} against {size(getattr(r, json_field))}"
            for r in (rows[0], rows[-1])
        )
        found = size_crossings(rows, protobuf_field, json_field)
        if found:
            where = " and ".join(
                f"{size(c.json_bytes)} of JSON (about {c.records:.0f} records; protobuf "
                + ("larger" if c.protobuf_larger_above else "smaller")
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


def section(
    groups: Sequence[Group], rows: Sequence[payload.PayloadRow], cases: Sequence[Case] = ()
) -> list[Block]:
    """The report's "Payload sweep" section; [] unless a pair ran at two or more counts."""
    pairs = sweeps(groups, rows)
    if not pairs:
        return []
    methods = [
        method
        for op, method in (
            ("encode", payload_model.ENCODING_METHOD),
            ("decode", payload_model.DECODING_METHOD),
        )
        if op in {s.operation for s in pairs} and payload_model.encoding_lines(cases, op)
    ]
    blocks: list[Block] = [
        Heading(2, "Payload sweep: where protobuf pays off"),
        Paragraph(
            "gRPC unary against each REST server at equal TLS, profile, response model and load model, "
            "from the fewest to the most records the run measured. "
            + payload_model.METHOD
            + " "
            + (" ".join(methods) if methods else NO_BENCHMARK)
            + " Where both services fill their quota, req/s is the quota over CPU per request: the same "
            "crossover holds for req/s."
        ),
    ]
    for scenario in dict.fromkeys(s.scenario for s in pairs):
        members = [s for s in pairs if s.scenario == scenario]
        # One direction per scenario (its words say "uploads"), so one operation per table.
        op = members[0].operation
        encodings = _format_lines(members[0], cases)
        blocks += [
            Paragraph(f"Cost model, {scenario}:"),
            table(
                (
                    "target",
                    "counts",
                    "a: ms per request",
                    "b: µs per record",
                    f"{FORMAT_ALONE[op]}: µs per record",
                    "held out: predicted / measured ms",
                    f"below {SERVICE_CPU_BOUND:.0%} of the quota",
                ),
                [_model_row(m, encodings, op) for m in _models(members)],
                (False, False, True, True, True, True, False),
            ),
            table(
                ("gRPC", "REST", "crossover [interval]", "gRPC - REST per record", FORMAT_ALONE[op]),
                [_crossover_row(s, encodings) for s in members],
                (False,) * 5,
            ),
        ]
    blocks += [
        Paragraph(
            f"Measured gRPC / REST at each count (geometric means of the repeats, Welch {CONFIDENCE:.0%} "
            "intervals): below 1 gRPC uses less CPU per request, above 1 it serves more req/s. The ratio "
            "of two affine costs is S-shaped in log records: the crossover comes from the lines above, "
            "not from these ratios."
        ),
        table(
            ("gRPC", "REST", "records", "JSON body", "protobuf body", "CPU / req ratio", "req/s ratio"),
            _ratio_rows(pairs),
            (False, False, True, True, True, True, True),
        ),
    ]
    left_out = sorted({f"{label}: {why}" for s in pairs for label, why in s.left_out})
    if left_out:
        blocks.append(Paragraph("Left out of the ratios: " + "; ".join(f"`{r}`" for r in left_out) + "."))
    return blocks


def _model_row(m: CostModel, encodings: Mapping[str, Line], op: str = "encode") -> list[str]:
    """encodings: the benchmark's lines of op, the operation of the model's direction."""
    codec = payload_model.encoder(m.protocol)
    label = codec if op == "encode" else f"{codec} {op}"
    encoding = f"{_interval(encodings[codec].per_record)} ({label})" if codec in encodings else "-"
    held = "- (fewer than three counts)"
    if m.held_out is not None:
        h = m.held_out
        held = f"{h.count:,}: {h.predicted:.3f} / {h.measured:.3f} ({h.error:+.1%})"
    return [
        m.target,
        ", ".join(f"{c:,}" for c in m.counts),
        _interval(m.line.fixed, scale=1, digits=3),
        _interval(m.line.per_record),
        encoding,
        held,
        ", ".join(f"c{i.count} {i.utilisation:.0%}" for i in m.idle) or "-",
    ]


def _crossover_row(s: Sweep, encodings: Mapping[str, Line]) -> list[str]:
    crossover = s.crossover
    if s.grpc_model is None or s.rest_model is None or crossover is None:
        return [s.grpc_target, s.rest_target, "no cost model: fewer than two counts", "-", "-"]
    grpc, rest = s.grpc_model.line, s.rest_model.line
    servers = f"{_interval(payload_model.per_record_difference(grpc, rest), '+')} µs"
    encoding = "-"
    if (split := payload_model.per_record_split(grpc, rest, encodings)) is not None:
        share = split.format_share
        encoding = f"{split.encoding * 1000:+.2f} µs" + (f" ({share:.0%} of it)" if share is not None else "")
    return [s.grpc_target, s.rest_target, payload_model.crossover_text(crossover), servers, encoding]


def _ratio_rows(pairs: Sequence[Sweep]) -> list[list[str]]:
    rows = []
    for s in pairs:
        by_count = {m: {p.count: p for p in s.points[m]} for m in SWEPT}
        for count in sorted({p.count for m in SWEPT for p in s.points[m]}):
            point = next(by_count[m][count] for m in SWEPT if count in by_count[m])
            rows.append(
                [
                    s.grpc_target,
                    s.rest_target,
                    f"{count:,}",
                    size(point.json_bytes),
                    size(point.protobuf_bytes),
                    *(_cell(by_count[m].get(count)) for m in SWEPT),
                ]
            )
    return rows


def _interval(e: Estimate, sign: str = "", scale: float = 1000, digits: int = 2) -> str:
    """value [low, high] times scale (by default ms to µs), or the value alone without an interval."""
    text = f"{e.value * scale:{sign}.{digits}f}"
    if e.low is None or e.high is None:
        return text
    return f"{text} [{e.low * scale:{sign}.{digits}f}, {e.high * scale:{sign}.{digits}f}]"


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
