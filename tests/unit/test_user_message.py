"""The user's own message (--proto, issue 38 item 2): a .proto none of the lab's code knows, compiled at
run time (run/user_proto.prepare); its records made by the generator or from a sample; the canonical JSON
a REST server sends parsed back by json_format into the very message a gRPC server sends; an upload
decoded from JSON and from protobuf into equal records; and each bad input refused in one line."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from labrunner.cli.run_matrix import EXIT_USAGE, main
from labrunner.run.user_proto import largest_body, prepare

from services.common import user_message
from services.common.records import BadRequest
from services.common.user_message import DESCRIPTOR_SET, SHAPE_FILE, Generator, UserMessage, UserMessageError
from tests.support import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "user_proto"
WEATHER = FIXTURES / "weather.proto"
MESSAGE = "weather.v1.Observation"
CHOICES = Generator(string_chars=12, repeated=4, map_entries=2, depth=1)


@pytest.fixture(scope="module", autouse=True)
def _built_in_shapes_after() -> Iterator[None]:
    """This module installs the user's message in its worker process; the modules after it there
    (the docker flow's containers among them) must see the built-in shapes only."""
    yield
    user_message.uninstall()


def _prepare(
    directory: Path, proto: Path = WEATHER, message: str = MESSAGE, sample: Path | None = None
) -> UserMessage:
    return prepare(
        proto, message, sample, directory=directory, lab_proto_dir=ROOT / "proto", generator=CHOICES
    )


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> UserMessage:
    return _prepare(tmp_path_factory.mktemp("shape"))


def test_the_run_directory_holds_the_compiled_set_and_the_choices(user: UserMessage) -> None:
    assert (user.directory / DESCRIPTOR_SET).stat().st_size > 0
    written = orjson.loads((user.directory / SHAPE_FILE).read_bytes())
    assert written["message"] == MESSAGE and written["generator"]["string_chars"] == 12
    assert user.shape.service.full_name == "protolab.user.v1.RecordService"
    assert [m.name for m in user.shape.service.methods] == [
        "ListRecords",
        "StreamRecords",
        "CreateRecords",
        "UploadRecords",
    ]
    described = user.describe()
    assert described["message"] == MESSAGE and described["records"]["depth"] == 1


def test_the_rest_json_parses_back_into_the_message_grpc_sends(user: UserMessage) -> None:
    shape = user.shape
    for record in user.pool(200, 7):
        neutral = shape.from_json(record)
        message = shape.fill(shape.record_message(), neutral)
        (body,) = shape.to_json([neutral])
        parsed = json_format.Parse(orjson.dumps(body), shape.record_message())
        assert parsed.SerializeToString(deterministic=True) == message.SerializeToString(deterministic=True)
        # And json_format's own JSON of the message holds the same record.
        again = json_format.Parse(json_format.MessageToJson(message), shape.record_message())
        assert shape.from_message(again) == neutral == shape.from_message(message)


def test_the_generator_keeps_its_stated_lengths_and_its_seed(user: UserMessage) -> None:
    pool = user.pool(50, 42)
    assert pool == user.pool(50, 42) and pool != user.pool(50, 43)
    for record in pool:
        assert len(record["id"]) == 12 and len(record["temperatures"]) == 4
        assert len(record["labels"]) == 2 and record.get("sky", "SKY_UNSPECIFIED") in {
            "SKY_UNSPECIFIED",
            "CLEAR",
            "CLOUDY",
            "STORM",
        }
        assert len(record["neighbours"]) == 4 and len(record["station"]["code"]) == 12
        assert isinstance(record["takenAtMs"], str)  # canonical JSON: an int64 is a string of digits
        assert ("sensor" in record) != ("manualEntry" in record)  # one member of the oneof
    # depth 1: the record's messages are filled, theirs (none here) would stay unset
    shallow = _prepare_at_depth(user, 0)
    assert all("station" not in record and "neighbours" not in record for record in shallow)


def _prepare_at_depth(user: UserMessage, depth: int) -> list[dict[str, Any]]:
    from services.common.user_message import generate  # noqa: PLC0415

    return [user.codec.to_json(r) for r in generate(user.codec, Generator(depth=depth), 5, 1)]


def test_an_upload_decodes_alike_from_json_and_from_protobuf(user: UserMessage) -> None:
    shape = user.shape
    records = user.pool(20, 3)
    from_json = [shape.from_json(r) for r in records]
    create: Any = json_format.Parse(orjson.dumps({"records": records}), shape.create_message())
    from_protobuf = [shape.from_message(m) for m in create.records]
    assert from_json == from_protobuf
    assert shape.checksum(from_json) == shape.checksum(from_protobuf)
    assert shape.checksum(from_json[:-1]) != shape.checksum(from_json)


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ([], "records[0]: expected an object"),
        ({"nope": 1}, "records[0].nope: unknown field"),
        ({"takenAtMs": "12x"}, "records[0].takenAtMs: expected an integer"),
        ({"quality": -1}, "records[0].quality: out of range for a uint32"),
        ({"temperatures": [1.5, "hot"]}, "records[0].temperatures[1]: expected a number"),
        ({"sky": "FOGGY"}, "records[0].sky: expected one of SKY_UNSPECIFIED, CLEAR, CLOUDY, STORM"),
        ({"labels": {"a": 1}}, "records[0].labels.a: expected a string"),
        ({"raw": "***"}, "records[0].raw: not base64"),
        ({"station": {"elevationM": 1e300}}, "records[0].station.elevationM: out of range for a float"),
        ({"sensor": "s", "manualEntry": 2}, "records[0]: sensor and manualEntry are members of one oneof"),
    ],
)
def test_a_bad_upload_record_is_named_by_its_place(user: UserMessage, item: Any, problem: str) -> None:
    assert user.shape.from_upload is not None
    with pytest.raises(BadRequest) as refused:
        user.shape.from_upload(item, "records[0]")
    assert str(refused.value).startswith(problem)


def test_a_sample_gives_the_records_in_order(tmp_path: Path) -> None:
    sample = tmp_path / "sample.json"
    sample.write_text('[{"id": "a", "sky": "STORM", "temperatures": [1.25]}, {"id": "b", "takenAtMs": 5}]')
    user = _prepare(tmp_path / "shape", sample=sample)
    pool = user.pool(5, 42)
    assert [record["id"] for record in pool] == ["a", "b", "a", "b", "a"]
    assert pool[1] == {"id": "b", "takenAtMs": "5"}  # canonical: json_format's


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("broken", '--proto {proto} does not compile: {proto}:3:3: "strin" is not defined.'),
        ("missing", "--message weather.v1.Nope is not in {proto} (its messages: weather.v1.Empty,"),
        ("empty", "--message weather.v1.Empty: weather.v1.Empty has no fields"),
        (
            "any",
            "--message weather.v1.Wrapped: weather.v1.Wrapped.detail: google.protobuf.Any is a well-known",
        ),
        ("sample", "--sample {sample} does not parse into weather.v1.Observation:"),
        ("nan", "--sample {sample}: message 0 holds a number that is not finite"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path: Path, case: str, error: str) -> None:
    proto, message, sample = WEATHER, MESSAGE, None
    if case == "broken":
        proto = tmp_path / "broken.proto"
        proto.write_text('syntax = "proto3";\nmessage Broken {\n  strin id = 1;\n}\n')
    elif case == "missing":
        message = "weather.v1.Nope"
    elif case == "empty":
        message = "weather.v1.Empty"
    elif case == "any":
        proto, message = FIXTURES / "with_any.proto", "weather.v1.Wrapped"
    else:
        sample = tmp_path / "sample.json"
        sample.write_text('{"id": 5}' if case == "sample" else '{"temperatures": ["NaN"]}')
    with pytest.raises(UserMessageError) as refused:
        _prepare(tmp_path / "shape", proto, message, sample)
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith(error.format(proto=proto, sample=sample)), text


def test_the_largest_body_reads_the_pool_as_the_servers_rotate(user: UserMessage) -> None:
    one_json, one_protobuf = largest_body(user, 1, 30, 42)
    ten_json, ten_protobuf = largest_body(user, 10, 30, 42)
    assert 5 * one_json < ten_json <= 10 * one_json and 5 * one_protobuf < ten_protobuf <= 10 * one_protobuf
    assert one_protobuf < one_json


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["--backend", "local", "--preset", "ci", "--dry-run", *args])
    return code, capsys.readouterr().err


def test_the_runner_refuses_what_it_cannot_serve_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    proto = ("--proto", str(WEATHER), "--message", MESSAGE)
    assert _dry_run(capsys, *proto, "--target", "aiohttp-h1,grpc", "--count", "10")[0] == 0
    sample = tmp_path / "long.json"
    sample.write_text(orjson.dumps({"id": "x" * 2000}).decode())
    code, err = _dry_run(capsys, *proto, "--sample", str(sample), "--target", "aiohttp-h1", "--count", "1000")
    # 1,000 records of 2 KB: over the default MAX_REQUEST_BYTES (1 MiB)
    assert code == EXIT_USAGE and "1000 records take up to 20" in err and "MAX_REQUEST_BYTES=1048576" in err
    code, err = _dry_run(capsys, *proto, "--preset", "floor", "--count", "10")
    assert code == EXIT_USAGE and "the floor servers serve the built-in shapes only, not floor-" in err
    code, err = _dry_run(capsys, "--proto", str(WEATHER))
    assert code == EXIT_USAGE and "--proto needs --message PKG.TYPE" in err
    code, err = _dry_run(capsys, *proto, "--shape", "numeric")
    assert code == EXIT_USAGE and "leave out --shape" in err
    code, err = _dry_run(capsys, "--shape", "proto")
    assert code == EXIT_USAGE and "give both" in err
