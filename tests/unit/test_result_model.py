"""The typed result model (results/result.py): summary.csv's columns are its fields' and no others,
its sections mirror what the runner stores, and results of older releases parse with their gaps
filled in by the parser alone."""

import collections
import json
import shutil
from dataclasses import fields
from pathlib import Path

from labrunner.backends.base import ServiceUsage
from labrunner.report.summary import SUMMARY_COLUMNS, summary_row
from labrunner.results import result as model
from labrunner.results.store import load_results
from labrunner.run.k6.output import K6Metrics

from tests.support import ROOT

OLD_RUN = ROOT / "tests" / "fixtures" / "run-0.2.0"


def test_every_summary_column_is_a_field_of_the_model_and_every_shown_field_a_column() -> None:
    declared = model.columns()
    twice = [c for c, n in collections.Counter(declared).items() if n > 1]
    assert not twice, f"columns declared by more than one field of the result model: {twice}"
    missing = [c for c in declared if c not in SUMMARY_COLUMNS]
    assert not missing, f"fields of the result model shown in summary.csv, not in SUMMARY_COLUMNS: {missing}"
    unfed = [c for c in SUMMARY_COLUMNS if c not in declared]
    assert not unfed, f"summary.csv columns no field of the result model declares (_shown): {unfed}"


def test_a_row_of_summary_csv_fills_exactly_its_declared_columns(tmp_path: Path) -> None:
    results = load_results(_copy(tmp_path))
    assert results
    for result in results:
        assert tuple(summary_row(result)) == SUMMARY_COLUMNS


def test_the_stored_sections_name_what_the_runner_measures() -> None:
    # A field of the model is read from the stored JSON under its own name: the runner's name.
    k6 = {f.name for f in fields(K6Metrics)}
    assert {f.name for f in fields(model.Metrics)} <= k6
    usage = {f.name for f in fields(ServiceUsage)} | {"cpu_utilisation"}  # the outcome's, stored beside
    assert {f.name for f in fields(model.Usage)} <= usage


def test_results_of_release_0_2_0_parse_whole(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    results = load_results(run)
    assert len(results) == len(list((run / "scenarios").glob("*.json")))
    grpc = next(r for r in results if r.scenario.target == "grpc")
    assert grpc.metrics is not None and grpc.metrics.requests_per_second > 0
    assert grpc.usage is not None and grpc.usage.cpu_seconds
    assert grpc.verdict is not None  # 0.2.0 stored its verdict
    assert grpc.network.profile == "loopback"


def test_what_an_older_result_lacks_is_filled_in_by_the_parser(tmp_path: Path) -> None:
    [path, *_] = sorted((_copy(tmp_path) / "scenarios").glob("*.json"))
    data = json.loads(path.read_text())
    for key in ("script", "response_model", "direction", "shape", "network"):
        data["scenario"].pop(key, None)
    del data["network"], data["lower_bound"], data["k6"]["metrics"]["latency_count"]
    old = model.parse_result(data)
    assert (old.scenario.script, old.scenario.response_model) == (
        model.BEFORE_SCRIPTS,
        model.BEFORE_RESPONSE_MODELS,
    )
    assert (old.scenario.direction, old.network.profile) == (model.BEFORE_UPLOADS, model.BEFORE_NETWORKS)
    assert old.scenario.shape == model.BEFORE_SHAPES
    assert old.verdict is None  # judged from its figures (trust.verdict_of)
    assert old.metrics is not None and old.metrics.latency_count == old.metrics.requests


def test_a_file_that_is_no_result_is_not_loaded(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    path = next((run / "scenarios").glob("*.json"))
    data = json.loads(path.read_text())
    del data["scenario"]["group"]
    path.write_text(json.dumps(data))
    assert path.stem not in {r.scenario_id for r in load_results(run)}


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    return run
