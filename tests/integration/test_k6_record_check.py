"""k6's record check (k6/lib/common.js recordChecks) asks for exactly the fields of proto/cars.proto's
descriptor, with their JSON names and types: run by a real k6 on records built from the descriptor."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.common.contract import RECORD_SHAPE
from tests.support import ROOT

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

# Evaluates recordChecks on each case and writes {check name: passed} per case to OUT.
SCRIPT = """
import { recordChecks } from '%(common)s';

const cases = JSON.parse(open(__ENV.CASES));

export default function () {}

export function handleSummary() {
  const results = cases.map(({ records, grpcDefaults }) => Object.fromEntries(
    Object.entries(recordChecks(records, grpcDefaults)).map(([name, check]) => [name, check()]),
  ));
  return { [__ENV.OUT]: JSON.stringify(results) };
}
"""
FIELDS_PRESENT = "record fields present"
VALUES = {str: "x", int: 1}  # a JSON value of each type the shape uses
WRONG = {str: 1, int: "1"}  # a value of the other type


def k6_binary() -> str:
    """k6 from K6_BIN, PATH, or next to this Python (the lab's venv)."""
    for candidate in (os.environ.get("K6_BIN"), shutil.which("k6"), str(Path(sys.executable).parent / "k6")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("k6 not found (set K6_BIN)")


def complete_record() -> dict[str, dict[str, Any]]:
    return {
        key: {name: VALUES[kind] for name, kind in shape.fields.items()}
        for key, shape in RECORD_SHAPE.items()
    }


def changed(key: str, name: str, value: Any = None) -> dict[str, dict[str, Any]]:
    """A complete record with one field removed (value None) or set to value."""
    record = complete_record()
    if value is None:
        del record[key][name]
    else:
        record[key][name] = value
    return record


def test_the_record_check_names_exactly_the_descriptors_fields(tmp_path: Path) -> None:
    # (record, grpcDefaults, whether the check must pass). gRPC decoding may drop proto3 zero
    # numbers, so with grpcDefaults an absent number passes; an absent string never does.
    cases: list[tuple[Any, bool, bool]] = [(complete_record(), False, True), (complete_record(), True, True)]
    for key, shape in RECORD_SHAPE.items():
        cases.append(({k: v for k, v in complete_record().items() if k != key}, False, False))
        for name, kind in shape.fields.items():
            cases.append((changed(key, name), False, False))
            cases.append((changed(key, name), True, kind is int))
            cases.append((changed(key, name, WRONG[kind]), False, False))
    (tmp_path / "cases.json").write_text(
        json.dumps([{"records": [record], "grpcDefaults": grpc} for record, grpc, _ in cases])
    )
    (tmp_path / "check.js").write_text(SCRIPT % {"common": (ROOT / "k6" / "lib" / "common.js").as_uri()})
    out = tmp_path / "results.json"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "K6_NO_USAGE_REPORT": "true", "COUNT": "1"}
    env |= {"CASES": str(tmp_path / "cases.json"), "OUT": str(out)}
    completed = subprocess.run(
        [k6_binary(), "run", "--quiet", str(tmp_path / "check.js")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(out.read_text())
    assert len(results) == len(cases)
    wrong = [
        (record, grpc, expected)
        for (record, grpc, expected), result in zip(cases, results, strict=True)
        if result[FIELDS_PRESENT] is not expected
    ]
    assert not wrong, wrong
