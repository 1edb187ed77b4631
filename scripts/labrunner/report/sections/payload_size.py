"""Payload size: the body bytes of one response of N records as JSON and protobuf, raw and gzip."""

from labrunner.report import charts as drawing
from labrunner.report import payload
from labrunner.report.document import Block, Heading, Paragraph, table
from labrunner.report.sections.section import Report, Section, always, figures
from labrunner.report.stats import CENTRE

TITLE = "Payload size"


def blocks(report: Report) -> list[Block]:
    rows, note = report.payload_rows, report.payload_note
    shown: list[Block] = [
        Heading(2, TITLE),
        Paragraph(
            f"Body bytes of one response of N records (the same records, pool offset 0) as REST JSON and "
            f"as the gRPC protobuf message, raw and gzip level {payload.GZIP_LEVEL}. Wire bytes add HTTP "
            "headers or gRPC framing, and TLS."
        ),
    ]
    if note:
        shown.append(Paragraph(note))
    shown.append(
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
    return shown


def charts(report: Report) -> list[Block]:
    drawn = drawing.payload_bytes(
        report.run.groups, report.payload_rows, report.charts_dir / "bytes_per_response.png"
    )
    return figures(
        [
            (
                drawn,
                "Bytes per response: on the wire and by encoding",
                f"left: {CENTRE} over repeats; right: the payload table below",
            )
        ]
    )


SECTION = Section(TITLE, always, blocks, charts)
