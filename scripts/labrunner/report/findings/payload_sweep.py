"""The payload question's findings: per (gRPC, REST) pair where their CPU per request crosses and how
much of the per-record difference is the format; the cost model's check; where the body sizes cross."""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from labrunner.report import payload, payload_model
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.payload_model import Line
from labrunner.report.payload_sweep import FORMAT_ALONE, SWEPT, Sweep, interval, models, size, sweeps
from labrunner.results.trust import SERVICE_CPU_BOUND

QUESTION = "payload"


def findings(evidence: Evidence) -> list[Finding]:
    """Per (gRPC, REST) pair its crossover and, with the serialization benchmark's cases, how much of
    the per-record difference is the format; then the model's check and the body sizes. [] for a run
    with one count."""
    pairs = sweeps(evidence.groups, evidence.payload_rows)
    if not pairs:
        return []
    found = [_pair_finding(s) for s in pairs]
    for s in pairs:
        if split := _format_finding(s, payload_model.format_lines(evidence.cases, s.direction, s.shape)):
            found.append(split)
    found += _by_shape(pairs)
    fitted = models(pairs)
    if fitted:
        found.append(Finding(QUESTION, payload_model.held_out_sentence(fitted) + "."))
    counts = sorted({g.count for s in pairs for g in (*s.grpc, *s.rest)})
    return found + size_findings([r for r in evidence.payload_rows if r.count in counts])


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


def _format_finding(s: Sweep, encodings: Mapping[str, Line]) -> Finding | None:
    """E.g. "grpc vs aiohttp-h1, per record: gRPC -5.00 [-5.40, -4.60] µs against REST; encoding alone
    -0.60 µs (protobuf 0.30, orjson 0.90): 12% of it the format, the rest the server."; "decoding alone"
    for an upload, from the benchmark's decode times (encodings: payload_model.format_lines of the pair)."""
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
        f"{s.grpc_target} vs {s.rest_target}, per record: gRPC {interval(split.servers, '+')} µs against "
        f"REST; {FORMAT_ALONE[s.operation]} {split.encoding * 1000:+.2f} µs (protobuf {protobuf}, "
        f"orjson {orjson}): "
        f"{verdict}.",
        held_fixed=s.held,
        answer=True,
    )


def _by_shape(pairs: Sequence[Sweep]) -> list[Finding]:
    """Where the answer changes with the record shape: per pair swept for two shapes or more (same
    conditions and TLS), gRPC - REST per record for each shape, e.g. "grpc vs aiohttp-h1, per record
    by shape: gRPC +3.2 [+2.1, +4.3] µs (cars), -0.8 [-1.5, -0.1] µs (numeric) against REST."."""
    families: dict[tuple[str, str, str], list[Sweep]] = {}
    for s in pairs:
        if s.grpc_model is not None and s.rest_model is not None:
            families.setdefault((s.grpc_target, s.rest_target, s.held_but_shape), []).append(s)
    found = []
    for (grpc, rest, held), members in families.items():
        if len(members) < 2:
            continue
        parts = []
        for s in members:
            assert s.grpc_model is not None and s.rest_model is not None
            difference = payload_model.per_record_difference(s.grpc_model.line, s.rest_model.line)
            parts.append(f"{interval(difference, '+', digits=1)} µs ({s.shape})")
        found.append(
            Finding(
                QUESTION,
                f"{grpc} vs {rest}, per record by shape: gRPC {', '.join(parts)} against REST.",
                held_fixed=held,
                answer=True,
            )
        )
    return found


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
