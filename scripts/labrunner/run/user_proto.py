"""--proto, --message, --sample: the user's own message compiled at run time into the run's shape/
directory (services.common.user_message), checked before anything starts, each refusal one line."""

import importlib.resources
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, message_factory
from google.protobuf.json_format import ParseError
from google.protobuf.message import Message

from labrunner.files import write_bytes_atomic
from services.common import pool as record_pool
from services.common import user_message
from services.common.user_message import (
    DESCRIPTOR_SET,
    PACKAGE,
    SHAPE_FILE,
    WRAPPER,
    Generator,
    ShapeFile,
    UserMessage,
    UserMessageError,
)

# The run directory's folder of the message's files: SHAPE_DIR of every service, mounted in containers.
SHAPE_DIR_NAME = "shape"
_LAB_PROTO = "cars.proto"  # the wrapper imports the lab's request and reply from it
_PROTOC_TIMEOUT_S = 60.0

_WRAPPER_TEXT = """\
// Written by protolab's runner for this run (docs/matrix.md, "Your own message"): the lab's four
// methods over {message}, from {proto}. Compiled with it into {descriptor_set}.
syntax = "proto3";

package {package};

import "{lab_proto}";
import "{user_file}";

message RecordList {{
  repeated .{message} records = 1;
}}

message CreateRecordsRequest {{
  repeated .{message} records = 1;
}}

service RecordService {{
  rpc ListRecords(protolab.cars.v1.ListRecordsRequest) returns (RecordList);
  rpc StreamRecords(protolab.cars.v1.ListRecordsRequest) returns (stream .{message});
  rpc CreateRecords(CreateRecordsRequest) returns (protolab.cars.v1.CreateRecordsReply);
  rpc UploadRecords(stream .{message}) returns (protolab.cars.v1.CreateRecordsReply);
}}
"""


def prepare(
    proto: Path,
    message: str,
    sample: Path | None,
    *,
    directory: Path,
    lab_proto_dir: Path,
    generator: Generator,
) -> UserMessage:
    """Compile proto with the wrapper into directory, check message and sample, and install the shape
    `proto` in this process; UserMessageError with a one-line reason for anything the lab cannot serve."""
    if not proto.is_file():
        raise UserMessageError(f"--proto {proto}: no such file")
    if proto.name in (_LAB_PROTO, WRAPPER):
        raise UserMessageError(f"--proto {proto}: the lab's own files are named {proto.name}; rename yours")
    directory.mkdir(parents=True, exist_ok=True)
    includes = (proto.parent, lab_proto_dir, directory)
    user_set = _protoc(proto.name, includes, directory / "user.protoset", what=f"--proto {proto}")
    pool = user_message.message_pool(user_set)
    try:
        descriptor = pool.FindMessageTypeByName(message)
    except KeyError:
        names = sorted(_messages_of(pool, proto.name))
        raise UserMessageError(
            f"--message {message} is not in {proto} (its messages: {', '.join(names) or 'none'})"
        ) from None
    if descriptor.file.name != proto.name:
        raise UserMessageError(f"--message {message} is in {descriptor.file.name}, not in {proto}")
    problems = user_message.refusals(descriptor)
    if problems:
        raise UserMessageError(f"--message {message}: {problems[0]}")
    wrapper = _WRAPPER_TEXT.format(
        message=message,
        proto=proto.name,
        descriptor_set=DESCRIPTOR_SET,
        package=PACKAGE,
        lab_proto=_LAB_PROTO,
        user_file=proto.name,
    )
    write_bytes_atomic(directory / WRAPPER, wrapper.encode())
    _protoc(WRAPPER, includes, directory / DESCRIPTOR_SET, what=f"the wrapper of {message}")
    (directory / "user.protoset").unlink()
    records = None if sample is None else _sample_records(sample, message, user_set)
    file = ShapeFile(message, str(proto), generator, records)
    write_bytes_atomic(directory / SHAPE_FILE, orjson.dumps(file.to_json(), option=orjson.OPT_INDENT_2))
    user = user_message.install(directory)
    for index, record in enumerate(records or ()):
        if not _finite(user.shape.from_json(record)):
            # The REST bodies write the pool's numbers as they are: NaN and infinities are no JSON number.
            raise UserMessageError(f"--sample {sample}: message {index} holds a number that is not finite")
    return user


def _finite(value: Any) -> bool:
    """Whether a neutral value holds no NaN or infinity, however deep."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple):
        return all(_finite(item) for item in value)
    return True


def _protoc(file: str, includes: tuple[Path, ...], out: Path, *, what: str) -> bytes:
    """protoc (grpc_tools, with its well-known types) on file: a FileDescriptorSet with every import."""
    well_known = Path(str(importlib.resources.files("grpc_tools") / "_proto"))
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        *(f"-I{path}" for path in (*includes, well_known)),
        "--include_imports",
        f"--descriptor_set_out={out}",
        file,
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S, check=False
    )
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        raise UserMessageError(f"{what} does not compile: {lines[0] if lines else 'protoc failed'}")
    return out.read_bytes()


def _messages_of(pool: Any, file_name: str) -> list[str]:
    """Every message of a file of the pool, nested ones too, by full name."""
    names: list[str] = []

    def walk(descriptors: Any) -> None:
        for descriptor in descriptors:
            if not descriptor.GetOptions().map_entry:
                names.append(descriptor.full_name)
            walk(descriptor.nested_types)

    walk(pool.FindFileByName(file_name).message_types_by_name.values())
    return names


def _sample_records(sample: Path, message: str, descriptor_set: bytes) -> list[dict[str, Any]]:
    """The sample's messages (one object, or an array of them) as canonical JSON, each parsed into the
    message by json_format; UserMessageError naming the first that does not parse."""
    try:
        document = orjson.loads(sample.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        raise UserMessageError(f"--sample {sample}: not a JSON file ({error})") from None
    items = document if isinstance(document, list) else [document]
    if not items:
        raise UserMessageError(f"--sample {sample}: holds no message")
    pool = user_message.message_pool(descriptor_set)
    record_class = message_factory.GetMessageClass(pool.FindMessageTypeByName(message))
    records = []
    for index, item in enumerate(items):
        try:
            parsed: Message = json_format.ParseDict(item, record_class())
        except (ParseError, TypeError, ValueError) as error:
            where = "" if len(items) == 1 else f" message {index}"
            raise UserMessageError(
                f"--sample {sample}{where} does not parse into {message}: {error}"
            ) from None
        records.append(json_format.MessageToDict(parsed))
    return records


def largest_body(user: UserMessage, count: int, size: int, seed: int) -> tuple[int, int]:
    """The largest JSON body and protobuf message of `count` consecutive pool records, (json, protobuf)
    bytes: the same records in either direction (an upload sends a GET body)."""
    shape = user.shape
    pool = record_pool.load_pool(size, seed, shape.name)
    json_sizes = [len(orjson.dumps(record)) + 1 for record in pool]  # its comma
    proto_sizes = []
    list_message: Any = shape.list_message()
    for record in pool:
        list_message.Clear()
        shape.fill(list_message.records.add(), shape.from_json(record))
        proto_sizes.append(list_message.ByteSize())
    return _window_max(json_sizes, count) + len(b'{"records":[]}'), _window_max(proto_sizes, count)


def _window_max(sizes: list[int], count: int) -> int:
    """The largest sum of `count` consecutive sizes, the pool read cyclically (as servers rotate)."""
    cycled = sizes + sizes[: count - 1] if count <= len(sizes) else sizes * (count // len(sizes) + 2)
    total = best = sum(cycled[:count])
    for index in range(count, min(len(cycled), len(sizes) + count - 1)):
        total += cycled[index] - cycled[index - count]
        best = max(best, total)
    return best
