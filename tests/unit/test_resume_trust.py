"""The runner refuses what it cannot trust (issue 37 item 6), on real files in a run directory:
--resume keeps only results whose scenario is the plan's, and moves the others aside saying why; a
manifest the lab did not write is one line of error; --out never writes over a directory that holds
something other than a lab run."""

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from labrunner.cli import report, run_matrix
from labrunner.cli.resume import IGNORED_DIR, resumed
from labrunner.files import write_json_atomic
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides, Scenario
from labrunner.report import build
from labrunner.results.store import (
    MANIFEST_SCHEMA,
    RESULT_SCHEMA,
    ManifestError,
    checked_manifest,
    result_path,
    resumable,
    scenario_dict,
)
from labrunner.run import user_proto

from tests.support import ROOT

EXIT_USAGE = 2


def _plan() -> tuple[Scenario, ...]:
    overrides = Overrides(targets=("aiohttp-h1", "grpc"))
    return expand(load_matrix(ROOT / "matrix.toml"), "local", "default", overrides).scenarios


def _ok(scenario: Scenario, **changed: Any) -> dict[str, Any]:
    """An ok result of the scenario as the runner writes its identity, with `changed` in its scenario."""
    return {
        "schema": RESULT_SCHEMA,
        "scenario_id": scenario.id,
        "status": "ok",
        "scenario": scenario_dict(scenario) | changed,
    }


def test_resume_keeps_only_results_of_the_planned_scenarios(tmp_path: Path) -> None:
    plan = _plan()
    kept, bigger, other_count, renamed, failed = plan[:5]
    write_json_atomic(result_path(tmp_path, kept.id), _ok(kept))
    # The matrix's profile changed since: the same id, another budget.
    profile = scenario_dict(bigger)["profile"] | {"cpus": 1.0}
    write_json_atomic(result_path(tmp_path, bigger.id), _ok(bigger, profile=profile))
    write_json_atomic(result_path(tmp_path, other_count.id), _ok(other_count, count=1000))
    write_json_atomic(result_path(tmp_path, "copied-by-hand"), _ok(renamed))
    write_json_atomic(result_path(tmp_path, failed.id), _ok(failed) | {"status": "failed"})
    foreign = replace(kept, count=3)  # a scenario this plan does not have
    write_json_atomic(result_path(tmp_path, foreign.id), _ok(foreign))
    added = replace(kept, repeat=kept.repeats + 1)  # a further block of a planned group (--precision)
    write_json_atomic(result_path(tmp_path, added.id), _ok(added))

    found = resumable(tmp_path, plan)
    assert found.done == {kept.id, added.id}  # a failed result is rerun, unnamed
    assert found.ignored == {
        f"{bigger.id}.json": (
            f"its profile is {{name: {bigger.profile.name}, cpus: 1.0, memory_bytes: "
            f"{bigger.profile.memory_bytes}}}, the plan's {{name: {bigger.profile.name}, cpus: "
            f"{bigger.profile.cpus}, memory_bytes: {bigger.profile.memory_bytes}}}"
        ),
        f"{other_count.id}.json": f"its count is 1000, the plan's {other_count.count}",
        "copied-by-hand.json": f"it measured {renamed.id!r}, not the scenario its name says",
        f"{foreign.id}.json": "no scenario of this plan has its id",
    }


def test_resume_says_what_it_ignored_and_moves_it_out_of_the_run(tmp_path: Path) -> None:
    plan = _plan()
    kept, changed = plan[:2]
    write_json_atomic(result_path(tmp_path, kept.id), _ok(kept))
    write_json_atomic(result_path(tmp_path, changed.id), _ok(changed, direction="upload"))
    said: list[str] = []
    assert resumed(tmp_path, plan, said.append) == {kept.id}
    aside = tmp_path / "scenarios" / IGNORED_DIR
    assert said == [
        f"resume: 1 result file(s) not trusted, moved to {aside}:",
        f"  {changed.id}.json: its direction is upload, the plan's download",
    ]
    assert not result_path(tmp_path, changed.id).exists()
    assert json.loads((aside / f"{changed.id}.json").read_text())["scenario"]["direction"] == "upload"
    said.clear()
    assert resumed(tmp_path, plan, said.append) == {kept.id} and said == []  # nothing left to say


@pytest.mark.parametrize(
    ("manifest", "error"),
    [
        ({"matrix": 5}, "matrix is 5, not an object"),
        ({"matrix": {"seed": "7"}}, 'matrix.seed is "7", not a whole number'),
        ({"run_id": ["a"]}, 'run_id is ["a"], not a string'),
        ({"resumed_at": None}, "resumed_at is null, not a list"),
        ({"methodology": True}, "methodology is true, not a whole number"),
    ],
)
def test_a_malformed_manifest_is_one_line_of_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: dict[str, Any], error: str
) -> None:
    run = tmp_path / "run"
    write_json_atomic(run / "manifest.json", {"schema": MANIFEST_SCHEMA, **manifest})
    with pytest.raises(ManifestError, match=re.escape(error)):
        checked_manifest(run)
    argv = ["--backend", "local", "--preset", "ci", "--resume", "--out", str(run)]
    assert run_matrix.main(argv) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"run_matrix.py: error: {run / 'manifest.json'}: {error}")


def test_a_manifest_that_is_not_the_labs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for text, error in (
        ("[1, 2]", "holds list"),
        ("{", "is unreadable"),
        ('{"schema": "other/1"}', "is not a lab manifest"),
    ):
        (tmp_path / "manifest.json").write_text(text)
        with pytest.raises(ManifestError, match=error):
            checked_manifest(tmp_path)
        assert run_matrix.main(["--backend", "local", "--preset", "ci", "--out", str(tmp_path)]) == EXIT_USAGE
        assert len(capsys.readouterr().err.splitlines()) == 1
    assert checked_manifest(tmp_path / "none") == {}


def test_out_on_a_directory_that_is_no_lab_run_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "charts").mkdir(parents=True)
    (theirs / "charts" / "plot.png").write_bytes(b"\x89PNG")
    (theirs / "summary.md").write_text("my notes\n")
    before = sorted((p.relative_to(theirs), p.read_bytes()) for p in theirs.rglob("*") if p.is_file())
    for extra in ([], ["--resume"]):
        assert (
            run_matrix.main(["--backend", "local", "--preset", "ci", "--out", str(theirs), *extra])
            == EXIT_USAGE
        )
        [line] = capsys.readouterr().err.splitlines()
        assert line == (
            f"run_matrix.py: error: {theirs} is not empty and holds no lab run (no manifest.json): "
            "choose another --out"
        )
    after = sorted((p.relative_to(theirs), p.read_bytes()) for p in theirs.rglob("*") if p.is_file())
    assert after == before


def test_the_inputs_a_run_reads_are_no_reason_to_refuse_its_directory(tmp_path: Path) -> None:
    # A run may find the serialization benchmark and the payload sizes already there (the e2e tests
    # put them there): those it reads, never writes over; they are what report/build.py names. And the
    # compiled message of a --proto run (its shape/ directory), written before the run starts.
    assert {build.PAYLOAD_FILE, build.SERIALIZATION_FILE, user_proto.SHAPE_DIR_NAME} == run_matrix._INPUTS
    out = tmp_path / "out"
    write_json_atomic(out / build.SERIALIZATION_FILE, {})
    run_matrix._check_out_dir(out, resume=False)  # no error
    (out / "notes.txt").write_text("mine")
    with pytest.raises(run_matrix._Usage, match="holds no lab run"):
        run_matrix._check_out_dir(out, resume=False)


def test_report_py_says_what_is_wrong_with_a_manifest_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scenarios").mkdir()
    write_json_atomic(tmp_path / "manifest.json", {"schema": MANIFEST_SCHEMA, "matrix": 5})
    assert report.main([str(tmp_path)]) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"report.py: error: {tmp_path / 'manifest.json'}: matrix is 5, not an object"
    assert not (tmp_path / "summary.md").exists()
