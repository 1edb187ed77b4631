"""The serialization micro-benchmark: encode and decode with orjson, stdlib json and protobuf."""

from labrunner.report import charts as drawing
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, always, figures
from labrunner.report.stats import CENTRE, CONFIDENCE, METHOD_LINE

TITLE = "Serialization micro-benchmark"


def blocks(report: Report) -> list[Block]:
    bench, cases = report.bench, report.cases
    heading = Heading(2, TITLE)
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


def charts(report: Report) -> list[Block]:
    drawn = drawing.serialization(report.cases, report.charts_dir / "serialization.png")
    return figures(
        [
            (
                drawn,
                "Serialization: microseconds per operation",
                f"bars: {CENTRE} of the iterations; whiskers: its {CONFIDENCE:.0%} log-scale interval",
            )
        ]
    )


SECTION = Section(TITLE, always, blocks, charts)
