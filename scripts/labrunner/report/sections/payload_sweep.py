"""Payload sweep: per (gRPC, REST) pair the cost models a + b·n, where they cross, and the measured
ratios by count as the evidence."""

from collections.abc import Mapping, Sequence

from labrunner.report import payload, payload_charts, payload_model
from labrunner.report.compare import Group
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.payload_model import CostModel, Line
from labrunner.report.payload_sweep import FORMAT_ALONE, SWEPT, Point, Sweep, interval, models, size, sweeps
from labrunner.report.sections.section import Report, Section, figures
from labrunner.report.serialization import Case
from labrunner.report.stats import CONFIDENCE
from labrunner.results.trust import SERVICE_CPU_BOUND

TITLE = "Payload sweep: where protobuf pays off"


def applies(report: Report) -> bool:
    """Whether a pair ran at two or more counts."""
    return bool(sweeps(report.run.groups, report.payload_rows))


def blocks(report: Report) -> list[Block]:
    return section(report.run.groups, report.payload_rows, report.cases)


def charts(report: Report) -> list[Block]:
    return figures(payload_charts.drawn(report.run.groups, report.payload_rows, report.charts_dir))


NO_BENCHMARK = "No serialization benchmark in this run (serialization.json): no encoding-alone figures."


def section(
    groups: Sequence[Group], rows: Sequence[payload.PayloadRow], cases: Sequence[Case] = ()
) -> list[Block]:
    """Per scenario the pairs' cost models and crossovers, then the measured ratios by count."""
    pairs = sweeps(groups, rows)
    methods = [
        method
        for op, method in (
            ("encode", payload_model.ENCODING_METHOD),
            ("decode", payload_model.DECODING_METHOD),
        )
        if any(s.operation == op and payload_model.encoding_lines(cases, op, s.shape) for s in pairs)
    ]
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            "gRPC unary against each REST server at equal TLS, profile, response model and load model, "
            "from the fewest to the most records the run measured. "
            + payload_model.METHOD
            + " "
            + (payload_model.speed_sentence(pairs[0].speed) + " " if pairs and pairs[0].speed else "")
            + (" ".join(methods) if methods else NO_BENCHMARK)
            + " Where both services fill their quota, req/s is the quota over CPU per request: the same "
            "crossover holds for req/s."
        ),
    ]
    for scenario in dict.fromkeys(s.scenario for s in pairs):
        members = [s for s in pairs if s.scenario == scenario]
        # One direction per scenario (its words say "uploads"), so one operation per table.
        op = members[0].operation
        encodings = payload_model.format_lines(cases, members[0].direction, members[0].shape)
        shown += [
            Paragraph(f"Cost model, {scenario}{', at one host speed' if members[0].speed else ''}:"),
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
                [_model_row(m, encodings, op) for m in models(members)],
                (False, False, True, True, True, True, False),
            ),
            table(
                ("gRPC", "REST", "crossover [interval]", "gRPC - REST per record", FORMAT_ALONE[op]),
                [_crossover_row(s, encodings) for s in members],
                (False,) * 5,
            ),
        ]
    shown += [
        Paragraph(
            f"Measured gRPC / REST at each count (paired by round, as every comparison within a run: a "
            f"duet block's two sides are one round; {CONFIDENCE:.0%} intervals): below 1 gRPC uses less "
            "CPU per request, above 1 it serves more req/s. The ratio of two affine costs is S-shaped "
            "in log records: the crossover comes from the lines above, "
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
        shown.append(Paragraph("Left out of the ratios: " + "; ".join(f"`{r}`" for r in left_out) + "."))
    return shown


def _model_row(m: CostModel, encodings: Mapping[str, Line], op: str = "encode") -> list[str]:
    """encodings: the benchmark's lines of op, the operation of the model's direction."""
    codec = payload_model.encoder(m.protocol)
    label = codec if op == "encode" else f"{codec} {op}"
    encoding = f"{interval(encodings[codec].per_record)} ({label})" if codec in encodings else "-"
    held = "- (fewer than three counts)"
    if m.held_out is not None:
        h = m.held_out
        held = f"{h.count:,}: {h.predicted:.3f} / {h.measured:.3f} ({h.error:+.1%})"
    return [
        m.target,
        ", ".join(f"{c:,}" for c in m.counts),
        interval(m.line.fixed, scale=1, digits=3),
        interval(m.line.per_record),
        encoding,
        held,
        ", ".join(f"c{i.count} {i.utilisation:.0%}" for i in m.idle) or "-",
    ]


def _crossover_row(s: Sweep, encodings: Mapping[str, Line]) -> list[str]:
    crossover = s.crossover
    if s.grpc_model is None or s.rest_model is None or crossover is None:
        return [s.grpc_target, s.rest_target, "no cost model: fewer than two counts", "-", "-"]
    grpc, rest = s.grpc_model.line, s.rest_model.line
    servers = f"{interval(payload_model.per_record_difference(grpc, rest), '+')} µs"
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
                    s.rest_target + s.variant,
                    f"{count:,}",
                    "-" if point.json_bytes is None else size(point.json_bytes),
                    "-" if point.protobuf_bytes is None else size(point.protobuf_bytes),
                    *(_cell(by_count[m].get(count)) for m in SWEPT),
                ]
            )
    return rows


def _cell(p: Point | None) -> str:
    if p is None:
        return "-"
    r = p.ratio
    if r.low is None or r.high is None:
        return f"{r.estimate:.2f}x ({r.note})"
    mark = "" if r.significant else " not significant"
    return f"{r.estimate:.2f}x [{r.low:.2f}, {r.high:.2f}]{mark}"


SECTION = Section(TITLE, applies, blocks, charts)
