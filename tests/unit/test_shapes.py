"""The record shapes (services.common.shapes, services.common.shape_pool): every shape's neutral form is
its proto message's fields, its JSON and its protobuf message carry the same values, an upload's
message comes back as the record it was made of, its checksum reads every field, and SHAPE is read
and refused as the other settings are."""

import tempfile
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import orjson
import pytest
from google.protobuf import json_format
from labrunner.model.matrix import MatrixError, expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.report.compare import compare_groups, group_results
from labrunner.results.result import parse_result
from labrunner.results.store import RESULT_SCHEMA, resumable, scenario_dict

from services.common import pool
from services.common.config import load_settings
from services.common.environment import ConfigError
from services.common.pool import SHAPES, generate_pool, load_pool
from services.common.records import BadRequest
from services.common.rest import shape_records_from_body
from services.common.shapes import CARS, SHAPE_KITS, shape_kit
from tests.support import ROOT, latency_from_p50, ok_result

SIZE, SEED = 300, 7


def test_every_shape_has_its_kit_in_the_pools_order_and_cars_comes_first() -> None:
    assert tuple(SHAPE_KITS) == SHAPES and SHAPES[0] == "cars" and shape_kit() is CARS
    with pytest.raises(ValueError, match="numeric, text, nested"):
        shape_kit("tall")
    with pytest.raises(ValueError, match="not one of"):
        generate_pool(3, SEED, "tall")


@pytest.mark.parametrize("shape", SHAPES)
def test_a_pool_is_the_same_for_the_same_seed_and_another_for_another(shape: str) -> None:
    first, again, other = (
        generate_pool(SIZE, SEED, shape),
        generate_pool(SIZE, SEED, shape),
        generate_pool(SIZE, 8, shape),
    )
    assert first == again and first != other
    assert len({orjson.dumps(record) for record in first}) == SIZE  # no two records alike


@pytest.mark.parametrize("shape", SHAPES)
def test_the_json_and_the_message_of_a_record_carry_the_same_values(shape: str) -> None:
    kit = shape_kit(shape)
    records = generate_pool(SIZE, SEED, shape)
    neutral = [kit.from_json(record) for record in records]
    body = orjson.dumps({"records": kit.to_json(neutral)})
    assert body == orjson.dumps({"records": records})  # the served JSON is the pool's, byte for byte
    built = kit.list_message()
    for record in neutral:
        kit.fill(built.records.add(), record)  # type: ignore[attr-defined]
    assert json_format.Parse(body, kit.list_message()) == built  # the REST body parses into gRPC's message
    again = kit.list_message.FromString(built.SerializeToString())
    assert [kit.from_message(message) for message in again.records] == neutral  # type: ignore[attr-defined]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_neutral_form_has_the_proto_messages_fields_in_order(shape: str) -> None:
    kit = shape_kit(shape)
    record = kit.from_json(generate_pool(1, SEED, shape)[0])
    if shape == "cars":
        names = [field.name for field in kit.record_message.DESCRIPTOR.fields]
        assert list(type(record)._fields) == names
        return
    assert list(type(record)._fields) == [field.name for field in kit.record_message.DESCRIPTOR.fields]
    assert list(kit.to_json([record])[0]) == [
        field.json_name for field in kit.record_message.DESCRIPTOR.fields
    ]


def _changed(value: object) -> object:
    if isinstance(value, bool):
        raise AssertionError("no bool in a record")
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):  # by the pool's precision: a hundredth (nested's prices have two decimals)
        return round(value + 0.01, 2)
    if isinstance(value, str):
        return value + "x"
    raise AssertionError(type(value))


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if shape != "cars"])
def test_the_checksum_reads_every_field(shape: str) -> None:
    kit = shape_kit(shape)
    records = generate_pool(20, SEED, shape)
    base = kit.checksum(kit.from_json(record) for record in records)
    paths: list[tuple[str | int, ...]] = []
    for key, value in records[0].items():
        if isinstance(value, list):
            paths += [(key, 0, inner) for inner in value[0]]
        elif isinstance(value, dict):
            paths += [(key, inner) for inner in value]
        else:
            paths.append((key,))
    assert len(paths) >= 3
    for path in paths:
        edited = orjson.loads(orjson.dumps(records))
        holder = edited[0]
        for step in path[:-1]:
            holder = holder[step]
        holder[path[-1]] = _changed(holder[path[-1]])
        assert kit.checksum(kit.from_json(record) for record in edited) != base, path
    assert kit.checksum(kit.from_json(record) for record in records[:-1]) != base  # a record lost


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if shape != "cars"])
def test_an_upload_of_the_shape_decodes_into_its_records_or_names_the_place(shape: str) -> None:
    kit = shape_kit(shape)
    assert kit.from_upload is not None
    records = generate_pool(5, SEED, shape)
    decoded = shape_records_from_body(kit.from_upload, orjson.dumps({"records": records}), 10)
    assert decoded == [kit.from_json(record) for record in records]
    first = next(iter(records[0]))
    missing = {key: value for key, value in records[0].items() if key != first}
    cases = {
        f"records[2].{first}: expected": [*records[:2], {**records[2], first: None}],
        "records[1].extra: unknown field": [*records[:1], {**records[1], "extra": 1}],
        f"records[0].{first}: missing": [missing],
        "records: expected 1 to 10 records, got 15": records * 3,
    }
    for message, sent in cases.items():
        with pytest.raises(BadRequest) as refused:
            shape_records_from_body(kit.from_upload, orjson.dumps({"records": sent}), 10)
        assert str(refused.value).startswith(message)
    with pytest.raises(BadRequest, match="body: expected an object"):
        shape_records_from_body(kit.from_upload, b"[]", 10)


def test_nested_uploads_check_their_items_and_attributes() -> None:
    kit = shape_kit("nested")
    assert kit.from_upload is not None
    record = generate_pool(1, SEED, "nested")[0]
    bad_item = {**record, "items": [*record["items"][:1], {**record["items"][0], "quantity": 2**31}]}
    with pytest.raises(BadRequest, match=r"records\[0\]\.items\[1\]\.quantity: expected a 32-bit integer"):
        shape_records_from_body(kit.from_upload, orjson.dumps({"records": [bad_item]}), 10)
    bad_attribute = {**record, "attributes": {"channel": 5}}
    with pytest.raises(BadRequest, match=r"records\[0\]\.attributes\.channel: expected a string"):
        shape_records_from_body(kit.from_upload, orjson.dumps({"records": [bad_attribute]}), 10)


def test_cars_keeps_its_cache_file_and_each_shape_has_its_own(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for shape in SHAPES:
        load_pool(4, SEED, shape)
    faker = version("faker")
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(
        [f"protolab-pool-4-{SEED}-faker{faker}.json"]
        + [f"protolab-pool-{shape}-4-{SEED}-faker{faker}.json" for shape in SHAPES[1:]]
    )
    assert load_pool(4, SEED, "text") == generate_pool(4, SEED, "text")
    assert pool.load_pool(4, SEED) == generate_pool(4, SEED)  # cars without a shape, as before


def test_shape_is_read_once_from_the_environment_and_refused_by_name(monkeypatch) -> None:
    monkeypatch.delenv("SHAPE", raising=False)
    assert load_settings("rest_aiohttp").shape == "cars"
    monkeypatch.setenv("SHAPE", "nested")
    assert load_settings("grpc_aio").shape == "nested"
    monkeypatch.setenv("SHAPE", "wide")
    with pytest.raises(ConfigError, match="SHAPE='wide' must be one of cars, numeric, text, nested"):
        load_settings("rest_aiohttp")
    monkeypatch.setenv("SHAPE", "text")
    monkeypatch.setenv("RECORD_MODE", "live")
    with pytest.raises(ConfigError, match="RECORD_MODE=live serves cars only"):
        load_settings("rest_aiohttp")


def test_the_matrix_axis_keeps_cars_ids_and_names_the_other_shapes() -> None:
    matrix = load_matrix(ROOT / "matrix.toml")
    base = Overrides(targets=("aiohttp-h1", "grpc"), counts=(10,), repeats=1)
    before = expand(matrix, "local", "default", base).scenarios
    assert {scenario.shape for scenario in before} == {"cars"}
    assert all(not scenario.id.endswith((".cars", ".numeric")) for scenario in before)
    numeric = expand(matrix, "local", "default", replace(base, shapes=("numeric",))).scenarios
    assert [s.shape for s in numeric] == ["numeric"] * len(before)
    # Every id is the cars id with .numeric after the load model and the response model and direction.
    assert sorted(s.id for s in numeric) == sorted(_with_shape(s.id, "numeric") for s in before)
    assert all(s.target_group.endswith(".numeric") for s in numeric)
    both = expand(matrix, "local", "default", replace(base, shapes=("cars", "numeric"))).scenarios
    assert sorted(s.id for s in both if s.shape == "cars") == sorted(s.id for s in before)
    assert sorted(s.id for s in both if s.shape == "numeric") == sorted(s.id for s in numeric)
    with pytest.raises(MatrixError, match="shapes"):
        expand(matrix, "local", "default", replace(base, shapes=("tall",)))
    with pytest.raises(MatrixError, match="the callers call cars only"):
        expand(matrix, "local", "caller", replace(base, targets=("aiohttp-h1",), shapes=("text",)))
    with pytest.raises(MatrixError, match="shapes"):
        expand(matrix, "local", "default", replace(base, shapes=("tall",)))


def _with_shape(scenario_id: str, shape: str) -> str:
    """A loopback cars id (no duet partner) with the shape where the group puts it: before .r<repeat>."""
    group, _, repeat = scenario_id.rpartition(".")
    return f"{group}.{shape}.{repeat}"


def test_a_result_records_its_shape_and_resume_keeps_only_the_planned_one(tmp_path: Path) -> None:
    matrix = load_matrix(ROOT / "matrix.toml")
    base = Overrides(targets=("aiohttp-h1",), counts=(10,), load_models=("closed",), repeats=1)
    (cars,) = expand(matrix, "local", "default", base).scenarios
    (numeric,) = expand(matrix, "local", "default", replace(base, shapes=("numeric",))).scenarios
    assert scenario_dict(cars)["shape"] == "cars" and scenario_dict(numeric)["shape"] == "numeric"
    (tmp_path / "scenarios").mkdir()

    def written(scenario_id: str, scenario: dict[str, object]) -> None:
        result = {"schema": RESULT_SCHEMA, "status": "ok", "scenario_id": scenario_id, "scenario": scenario}
        (tmp_path / "scenarios" / f"{scenario_id}.json").write_text(orjson.dumps(result).decode())

    before_shapes = {k: v for k, v in scenario_dict(cars).items() if k != "shape"}
    written(cars.id, before_shapes)  # a cars result written before shapes: no shape, and kept
    # A file named as the numeric scenario that measured cars under that name: not kept, and why.
    written(numeric.id, {**scenario_dict(numeric), "shape": "cars"})
    kept = resumable(tmp_path, [cars, numeric])
    assert kept.done == {cars.id}
    assert kept.ignored == {f"{numeric.id}.json": "its shape is cars, the plan's numeric"}


# Locally an eighth of a CPU, where two k6 outrun a duet's servers uploading; under docker a quarter.
@pytest.mark.parametrize(("backend", "profile"), [("local", "eighth"), ("docker", "quarter")])
def test_the_shapes_preset_sweeps_aiohttp_quart_and_grpc_both_ways_for_every_shape(
    backend: str, profile: str
) -> None:
    plan = expand(load_matrix(ROOT / "matrix.toml"), backend, "shapes", Overrides(repeats=1))
    got = {
        (s.target.name, s.profile.name, s.count, s.load_model.name, s.shape, s.direction)
        for s in plan.scenarios
    }
    assert got == {
        (target, profile, count, "closed", shape, direction)
        for target in ("aiohttp-h1", "quart-h1", "grpc")
        for count in (10, 100)
        for shape in SHAPES
        for direction in ("download", "upload")
    }
    assert plan.duet_questions == ("gRPC vs REST",)
    one = expand(load_matrix(ROOT / "matrix.toml"), backend, "shapes", Overrides(shapes=("text",), repeats=1))
    assert {s.shape for s in one.scenarios} == {"text"}


def test_groups_carry_their_shape_and_no_question_pairs_two_shapes() -> None:
    matrix = load_matrix(ROOT / "matrix.toml")
    base = Overrides(targets=("aiohttp-h1", "grpc"), counts=(10,), load_models=("closed",), repeats=1)
    cars = expand(matrix, "local", "default", base).scenarios
    numeric = expand(matrix, "local", "default", replace(base, shapes=("numeric",))).scenarios
    # aiohttp's numeric result beside grpc's cars result: the same in all but the shape.
    chosen = [s for s in numeric if s.target.name == "aiohttp-h1"] + [
        s for s in cars if s.target.name == "grpc"
    ]
    results = [
        parse_result(
            ok_result(
                s,
                requests=1000,
                rps=100.0,
                latency_ms=latency_from_p50(5.0),
                received_bytes=10**6,
                window_s=10.0,
                cpu_seconds=2.0,
                quota_used=0.99,
            )
        )
        for s in chosen
    ]
    groups = group_results(results)
    assert {(g.target, g.shape) for g in groups} == {("aiohttp-h1", "numeric"), ("grpc", "cars")}
    assert compare_groups(groups) == []  # gRPC vs REST would pair them were the shape not held
    both_cars = [
        parse_result(
            ok_result(
                s,
                requests=1000,
                rps=100.0,
                latency_ms=latency_from_p50(5.0),
                received_bytes=10**6,
                window_s=10.0,
                cpu_seconds=2.0,
                quota_used=0.99,
            )
        )
        for s in cars
    ]
    assert [c.kind for c in compare_groups(group_results(both_cars))] == ["gRPC vs REST"]
