"""Unit tests: calibration bookkeeping: the unit and its drift, its warnings, a fixed workload run
pinned in a fresh interpreter, taken again on a busy host, what others used of the host recorded."""

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from labrunner.cli import options
from labrunner.report import host_conditions
from labrunner.report.document import Paragraph
from labrunner.run import calibration

from tests.support import ROOT


def _calibration(before: float | None, after: float | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if before is not None:
        found["before"] = {"cpu_seconds_per_unit": before}
    if after is not None:
        found["after"] = {"cpu_seconds_per_unit": after}
    return found


def test_calibration_unit_and_drift() -> None:
    assert calibration.unit_seconds(_calibration(0.0004, 0.0006)) == pytest.approx(0.0005)
    assert calibration.unit_seconds(_calibration(0.0004, None)) == pytest.approx(0.0004)
    assert calibration.unit_seconds({"before": {"error": "boom"}}) is None
    assert calibration.unit_seconds(None) is None
    assert calibration.drift(_calibration(0.0004, 0.00042)) == pytest.approx(0.05)
    assert calibration.drift(_calibration(0.0004, None)) is None


def test_calibration_warnings_in_the_report() -> None:
    assert host_conditions.calibration_warnings({"calibration": _calibration(1.0, 1.049)}) == []
    [warning] = host_conditions.calibration_warnings({"calibration": _calibration(1.0, 1.06)})
    assert isinstance(warning, Paragraph) and "changed by +6.0%" in warning.text
    [same] = host_conditions.baseline_warnings(
        {"calibration": _calibration(1.0, 1.0)}, {"calibration": _calibration(1.09, 1.09)}, "base"
    )
    assert isinstance(same, Paragraph) and "Warning" not in same.text
    [differ] = host_conditions.baseline_warnings(
        {"calibration": _calibration(1.0, 1.0)}, {"calibration": _calibration(1.12, 1.12)}, "base"
    )
    assert isinstance(differ, Paragraph) and "**Warning: the calibrations differ by -10.7%**" in differ.text
    [none] = host_conditions.baseline_warnings({"calibration": _calibration(1.0, 1.0)}, {}, "base")
    assert isinstance(none, Paragraph) and "none in the baseline" in none.text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _pb_message(*fields: tuple[int, str | int | bytes]) -> bytes:
    """Protobuf's wire format by hand (proto3: a zero or empty field is not written)."""
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += _varint(number << 3) + _varint(value) if value else b""
        else:
            data = value.encode() if isinstance(value, str) else value
            out += _varint(number << 3 | 2) + _varint(len(data)) + data if data else b""
    return out


def _bytes_of_both_encodings(records: list[calibration.Record]) -> int:
    """What one unit produces, encoded without orjson or protobuf: the stdlib's compact JSON of the
    REST body, and proto/cars.proto's ListRecordsResponse written field by field."""
    body = {
        "records": [
            {
                "car": dict(zip(("make", "model", "trim", "color", "year", "mileage"), car, strict=True)),
                "driver": dict(zip(("firstname", "lastname", "driverId"), driver, strict=True)),
            }
            for car, driver in records
        ]
    }
    json_bytes = len(json.dumps(body, separators=(",", ":")).encode())
    message = _pb_message(
        *(
            (1, _pb_message((1, _pb_message(*enumerate(car, 1))), (2, _pb_message(*enumerate(driver, 1)))))
            for car, driver in records
        )
    )
    return json_bytes + len(message)


def test_calibration_workload_is_fixed() -> None:
    records = calibration.records()
    # One build-model response of the lab's default size, 100 records, the same on every host:
    # record i cycles through the fixed names (7 cars, 11 colours, 10 first and 9 last names).
    assert len(records) == 100
    assert records[0] == (("Toyota", "Corolla", "LE", "red", 1990, 0), ("Ada", "Lovelace", "D00000000"))
    # 99 % 7 = 1, 99 % 11 = 0, 1990 + 99 % 35 = 2019, 99 * 7,919 = 783,981 (33,981 after % 250,000),
    # 99 % 10 = 9, 99 % 9 = 0, 99 * 104,729 = 10,368,171.
    assert records[99] == (("Ford", "F-150", "XLT", "red", 2019, 33_981), ("Radia", "Lovelace", "D10368171"))
    assert calibration.records(3) == records[:3]
    # The unit is both encodings of those records: the bytes agree with encoders written here.
    assert calibration.unit(records) == _bytes_of_both_encodings(records)
    assert calibration.unit(records[:1]) == _bytes_of_both_encodings(records[:1])


def test_calibration_runs_pinned_in_a_fresh_interpreter() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "labrunner.run.calibration", "--cpus", "0", "--units", "5", "--rounds", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    measured = json.loads(out.stdout)
    assert measured["cpus"] == [0] and measured["units"] == 15 and measured["rounds"] == 3
    assert 0 < measured["cpu_seconds_per_unit"] <= measured["median_cpu_seconds_per_unit"]
    # The result names the workload it measured, versioned, so units of another workload are not compared.
    assert re.fullmatch(r"protolab\.calibration/\d+: .+", measured["workload"]), measured["workload"]


def _calibrations(monkeypatch: pytest.MonkeyPatch, others_shares: list[float]) -> None:
    """calibration.run answers with these others_share values in turn, and no pause between."""
    shares = iter(others_shares)
    monkeypatch.setattr(calibration, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(
        calibration,
        "run",
        lambda cpus, when, rounds: {
            "cpu_seconds_per_unit": 4e-4,
            "median_over_fastest": 1.1,
            "cpus": [1],
            "others_share": next(shares),
            "kernel": {"cpu_seconds_per_unit": 2.5e-5, "median_over_fastest": 1.2, "system_share": 0.5},
        },
    )


def test_a_calibration_on_a_busy_host_is_taken_again(monkeypatch: pytest.MonkeyPatch) -> None:
    _calibrations(monkeypatch, [0.21, 0.09, 0.01, 0.5])
    lines: list[str] = []
    result = calibration.calibrate([1], "before", lines.append)
    assert result["others_share"] == 0.01 and result["attempts"] == 3  # the first quiet one
    assert [line for line in lines if "again" in line] == [
        "calibration before: others used 21% of the host; again in 0 s",
        "calibration before: others used 9% of the host; again in 0 s",
    ]
    # Never more than CALIBRATION_ATTEMPTS: a host that stays busy keeps the last attempt.
    _calibrations(monkeypatch, [0.3] * calibration.CALIBRATION_ATTEMPTS + [0.0])
    assert calibration.calibrate([1], "after", lines.append)["others_share"] == 0.3


def test_one_attempt_takes_the_first_calibration_however_busy_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _calibrations(monkeypatch, [0.6, 0.0])  # --calibration-attempts 1
    lines: list[str] = []
    result = calibration.calibrate([1], "before", lines.append, attempts=1)
    assert (result["others_share"], result["attempts"]) == (0.6, 1)  # kept, with what others used
    assert not [line for line in lines if "again" in line]
    assert "others used 60.0% of the host" in lines[-1]


def test_calibration_records_what_others_used_of_the_host_in_the_rounds_asked() -> None:
    result = calibration.run([0], "before", rounds=3)  # --calibration-rounds 3
    assert "error" not in result, result
    assert 0.0 <= result["others_share"] <= 1.0
    assert result["rounds"] == result["kernel"]["rounds"] == 3


@pytest.mark.parametrize(
    ("parse", "text", "error"),
    [
        (options.rounds, "1", "'1': at least 2 rounds"),
        (options.rounds, "many", "'many' is not a whole number"),
        (options.attempts, "0", "'0': at least 1 attempt"),
        (options.attempts, "once", "'once' is not a whole number"),
    ],
)
def test_calibration_rounds_and_attempts_out_of_range_or_not_a_number_are_refused(
    parse: Callable[[str], int], text: str, error: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=error):
        parse(text)
    assert options.rounds("2") == 2 and options.attempts("1") == 1
