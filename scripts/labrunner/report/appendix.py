"""The report's closing sections: charts, the payload table and the serialization micro-benchmark."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labrunner.report import charts, latency_curve, payload, payload_charts, serialization
from labrunner.report.document import Block, Heading, Image, Paragraph, table
from labrunner.report.runs import Run
from labrunner.report.stats import CENTRE, CONFIDENCE, METHOD_LINE

NO_LATENCY_CHART = (
    "No latency chart: this run held no open-model runs (a ladder's rungs, or equal-load). Latency at "
    "saturation is set by the CPU quota more than by the protocol, so it is compared only at an offered "
    "load every target carried: add `--load-model loaded,loaded-stream` after the closed model."
)


def charts_section(
    run: Run, rows: Sequence[payload.PayloadRow], cases: Sequence[serialization.Case], out: Path
) -> list[Block]:
    whiskers = (
        f"bars: {CENTRE} of the repeats; whiskers: its {CONFIDENCE:.0%} log-scale interval; dots: repeats"
    )
    latency_chart = charts.latency(run.groups, out / "latency.png")
    drawn = [
        (
            charts.throughput(run.groups, out / "throughput.png"),
            "Requests/s at saturation (closed model), by target",
            f"{whiskers}; blue REST, orange gRPC",
        ),
        (
            latency_chart,
            "Latency percentiles p50 to p99.9 under an equal offered load (open model), by target",
            "lines: each percentile over every repeat's samples (shown where 10 lie beyond it); blue REST, "
            "orange gRPC, dashed TLS",
        ),
        *latency_curve.drawn(run.groups, out),
        (
            charts.efficiency(run.groups, out / "cpu_per_1k_requests.png"),
            "Service CPU seconds per 1,000 requests at saturation (lower is more efficient); streaming "
            "in its own panel",
            f"{whiskers}; blue REST, orange gRPC",
        ),
        (
            charts.payload_bytes(run.groups, rows, out / "bytes_per_response.png"),
            "Bytes per response: on the wire and by encoding",
            f"left: {CENTRE} over repeats; right: the payload table below",
        ),
        *payload_charts.drawn(run.groups, rows, out),
        (charts.sequential(run.groups, out / "sequential.png"), "Sequential mean latency by N", whiskers),
        (
            charts.capacity(run.groups, out / "capacity.png"),
            "Capacity search: p99 by offered rate",
            "x: failed steps; dashed: the SLO",
        ),
        (
            charts.serialization(cases, out / "serialization.png"),
            "Serialization: microseconds per operation",
            f"bars: {CENTRE} of the iterations; whiskers: its {CONFIDENCE:.0%} log-scale interval",
        ),
    ]
    images: list[Block] = [
        Image(path, alt, f"{alt}. {caption}.") for path, alt, caption in drawn if path is not None
    ]
    if latency_chart is None:
        images.append(Paragraph(NO_LATENCY_CHART))
    return [Heading(2, "Charts"), *images] if images else []


def payload_section(rows: Sequence[payload.PayloadRow], note: str) -> list[Block]:
    blocks: list[Block] = [
        Heading(2, "Payload size"),
        Paragraph(
            f"Body bytes of one response of N records (the same records, pool offset 0) as REST JSON and "
            f"as the gRPC protobuf message, raw and gzip level {payload.GZIP_LEVEL}. Wire bytes add HTTP "
            "headers or gRPC framing, and TLS."
        ),
    ]
    if note:
        blocks.append(Paragraph(note))
    blocks.append(
        table(
            ("records", "JSON", "JSON gzip", "protobuf", "protobuf gzip", "protobuf / JSON"),
            [
                [
                    str(r.count),
                    str(r.json_bytes),
                    str(r.json_gzip_bytes),
                    str(r.protobuf_bytes),
                    str(r.protobuf_gzip_bytes),
                    f"{r.protobuf_bytes / r.json_bytes:.2f}",
                ]
                for r in rows
            ],
        )
    )
    return blocks


def serialization_section(bench: Any) -> list[Block]:
    cases = serialization.cases_from_document(bench)
    heading = Heading(2, "Serialization micro-benchmark")
    if not cases:
        return [
            heading,
            Paragraph(
                "Not measured for this run (or measured by a version before its geometric means). "
                "Measure it on the run's host with `python scripts/bench_serialization.py --out "
                "RUN_DIR/serialization.json`, then rerun `scripts/report.py RUN_DIR`."
            ),
        ]
    budget = bench["budget"]
    rows = [
        [
            c.codec,
            c.operation,
            str(c.count),
            str(c.bytes),
            str(c.n),
            f"{c.geomean_us:.2f}",
            "n/a" if c.low_us is None or c.high_us is None else f"[{c.low_us:.2f}, {c.high_us:.2f}]",
            f"{c.min_us:.2f}",
            f"{c.max_us:.2f}",
        ]
        for c in cases
    ]
    return [
        heading,
        Paragraph(
            f"One Python thread, {bench['python']}, protobuf backend {bench['protobuf_backend']}, "
            + ", ".join(f"{k} {v}" for k, v in bench["versions"].items())
            + f"; {budget['iterations']} iterations of at least {budget['iteration_s'] * 1000:g} ms per case"
            + (" (quick)" if bench.get("quick") else "")
            + ". Encode: the pool's dicts (JSON) or a prebuilt message (protobuf) to bytes; decode: bytes "
            "to dicts or a message. Microseconds per operation over the iterations. " + METHOD_LINE
        ),
        table(
            ("codec", "operation", "records", "bytes", "n", CENTRE, f"{CONFIDENCE:.0%} CI", "min", "max"),
            rows,
            (False, False, True, True, True, True, True, True, True),
        ),
    ]
