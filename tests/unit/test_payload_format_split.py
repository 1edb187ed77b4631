"""Unit tests: the payload sweep's format-alone split reads the serialization benchmark's decode times
for uploads (the server parses the request body) and its encode times for downloads."""

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import UPLOAD, Overrides, Scenario
from labrunner.report import payload_model as pm
from labrunner.report import payload_sweep as ps
from labrunner.report.compare import Group, group_results
from labrunner.report.document import to_markdown
from labrunner.report.findings import payload_sweep as sweep_findings
from labrunner.report.findings.finding import Evidence, Finding
from labrunner.report.sections import payload_sweep as sweep_section
from labrunner.report.serialization import Case
from labrunner.results.result import parse_results

from tests.support import ROOT
from tests.unit.test_payload_sweep import ROWS, _rates, _result

COUNTS = (1, 10, 100, 1000)
# µs per body = fixed + per record · n. Encode and decode differ in both codecs and in which side of
# the difference is larger, so a split that reads the wrong operation cannot give the right number.
ENCODE = {"protobuf": (1.0, 0.3), "orjson": (0.5, 0.9)}  # protobuf - orjson: -0.60 µs per record
DECODE = {"protobuf": (2.0, 1.1), "orjson": (0.7, 1.6)}  # protobuf - orjson: -0.50 µs per record


def _findings(groups: Sequence[Group], cases: Sequence[Case] = ()) -> list[Finding]:
    return sweep_findings.findings(Evidence(tuple(groups), tuple(ROWS), tuple(cases)))


def _cases(op: str, costs: dict[str, tuple[float, float]]) -> list[Case]:
    return [
        Case(codec, op, n, 100 * n, 100, 15, fixed + per_record * n, None, None, 0.0, 0.0)
        for codec, (fixed, per_record) in costs.items()
        for n in COUNTS
    ]


CASES = (*_cases("encode", ENCODE), *_cases("decode", DECODE))


@cache
def _scenarios(direction: str) -> tuple[Scenario, ...]:
    overrides = Overrides(
        targets=("aiohttp-h1", "grpc"),
        repeats=3,
        directions=(direction,),
        profiles=("quarter",),
        counts=COUNTS,
    )
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "payload", overrides).scenarios


def _groups(direction: str) -> Any:
    rates = _rates()
    scenarios = [s for s in _scenarios(direction) if not s.target.tls]
    assert {s.direction for s in scenarios} == {direction}
    return group_results(
        parse_results([_result(s, rates[s.target.name, s.count][s.repeat - 1]) for s in scenarios])
    )


def _split_sentence(direction: str, cases: Sequence[Case] = CASES) -> str:
    found = _findings(_groups(direction), cases)
    (split,) = [f.sentence for f in found if f.sentence.startswith("grpc vs aiohttp-h1, per record:")]
    return split


def test_the_upload_direction_reads_decode_and_the_download_direction_encode() -> None:
    assert pm.operation(UPLOAD) == "decode" and pm.operation("download") == "encode"
    uploads = pm.format_lines(CASES, UPLOAD)
    downloads = pm.format_lines(CASES, "download")
    assert uploads["protobuf"].per_record.value == pytest.approx(0.0011, rel=1e-9)  # ms per record
    assert uploads["orjson"].per_record.value == pytest.approx(0.0016, rel=1e-9)
    assert downloads["protobuf"].per_record.value == pytest.approx(0.0003, rel=1e-9)
    assert downloads["orjson"].per_record.value == pytest.approx(0.0009, rel=1e-9)
    (upload_sweep,) = ps.sweeps(_groups(UPLOAD), ROWS)
    (download_sweep,) = ps.sweeps(_groups("download"), ROWS)
    assert (upload_sweep.operation, download_sweep.operation) == ("decode", "encode")
    for sweep, expected in ((upload_sweep, -0.0005), (download_sweep, -0.0006)):
        assert sweep.grpc_model is not None and sweep.rest_model is not None
        split = pm.per_record_split(
            sweep.grpc_model.line, sweep.rest_model.line, pm.format_lines(CASES, sweep.direction)
        )
        assert split is not None and split.encoding == pytest.approx(expected, rel=1e-9)


def test_the_upload_finding_says_decoding_alone_with_the_decode_times() -> None:
    upload = _split_sentence(UPLOAD)
    assert "decoding alone -0.50 µs (protobuf 1.10, orjson 1.60)" in upload, upload
    download = _split_sentence("download")
    assert "encoding alone -0.60 µs (protobuf 0.30, orjson 0.90)" in download, download


def test_an_upload_without_decode_times_has_no_split_even_with_encode_times() -> None:
    encode_only = _cases("encode", ENCODE)
    found = _findings(_groups(UPLOAD), encode_only)
    assert not [f for f in found if "per record:" in f.sentence]


def test_the_upload_section_labels_its_column_and_cells_decode() -> None:
    text = to_markdown(sweep_section.section(_groups(UPLOAD), ROWS, CASES), Path())
    assert "decoding alone: µs per record" in text and "encoding alone: µs per record" not in text
    assert "| 1.10 [1.10, 1.10] (protobuf decode) |" in text
    assert "| 1.60 [1.60, 1.60] (orjson decode) |" in text
    assert pm.DECODING_METHOD in text and pm.ENCODING_METHOD not in text
    download = to_markdown(sweep_section.section(_groups("download"), ROWS, CASES), Path())
    assert "| 0.30 [0.30, 0.30] (protobuf) |" in download and pm.ENCODING_METHOD in download
