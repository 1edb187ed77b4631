"""The user's own message as a record shape (SHAPE=proto, SHAPE_DIR: docs/matrix.md, "Your own message").

The runner compiles the user's .proto with a small wrapper (the lab's service over `repeated pkg.Type`)
into one FileDescriptorSet and writes it, with what it chose, into a directory (SHAPE_DIR): every server
and k6 load those same files, and no generated code exists. Messages come from protobuf's
message_factory; a record's neutral form is a tuple of its field values in the descriptor's order, which
one walk per message maps into canonical protobuf JSON (json_format's rules) for REST and into messages
for gRPC, so that every server does the same work for it, as for the built-in shapes.
"""

import base64
import binascii
import hashlib
import math
import random
import string
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from services.common import pool as record_pool
from services.common.pool import USER_SHAPE
from services.common.records import BadRequest, JsonRecord
from services.common.shapes import SHAPE_KITS, Shape

# SHAPE_DIR's files: the compiled wrapper (and every file it imports), and the choices (ShapeFile).
DESCRIPTOR_SET, SHAPE_FILE, WRAPPER = "records.protoset", "shape.json", "protolab_records.proto"
# The wrapper's names (the runner writes it: labrunner.run.user_proto): RecordService's four methods
# with protolab.cars.v1's request and reply, over the user's message.
PACKAGE = "protolab.user.v1"
SERVICE, LIST_MESSAGE, CREATE_MESSAGE = (
    f"{PACKAGE}.RecordService",
    f"{PACKAGE}.RecordList",
    f"{PACKAGE}.CreateRecordsRequest",
)
# An upload's record nested deeper than this is refused (a recursive message could nest without end).
MAX_DEPTH = 32

_FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
_INT_RANGES: dict[int, tuple[int, int]] = {
    **dict.fromkeys(
        (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32),
        (-(2**31), 2**31 - 1),
    ),
    **dict.fromkeys((FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32), (0, 2**32 - 1)),
    **dict.fromkeys(
        (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64),
        (-(2**63), 2**63 - 1),
    ),
    **dict.fromkeys((FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64), (0, 2**64 - 1)),
}
# Canonical JSON writes these as strings of digits.
_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
    }
)
_FLOATS = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# The well-known types have a JSON form of their own (Any holds a type URL): not served.
_WELL_KNOWN_PACKAGE = "google.protobuf"


class UserMessageError(ValueError):
    """The user's message cannot be served; the message says why in one line."""


@dataclass(frozen=True)
class Generator:
    """The generator's choices when no sample is given (written in the manifest)."""

    string_chars: int = 16  # every string's length; bytes fields get as many bytes
    repeated: int = 3  # every repeated field's elements
    map_entries: int = 3  # every map's entries
    depth: int = 2  # message fields filled this many levels below the record; deeper ones stay unset
    # ints: 32-bit ones uniform in [0, 2**31), 64-bit ones in [0, 2**53) (exact in any JSON reader);
    # doubles uniform in [0, 1e6) with three decimals; floats that value as a 32-bit float; enums one of
    # their values; bools either; a oneof one member; the pool's seed (RECORD_SEED) draws them all.


@dataclass(frozen=True)
class ShapeFile:
    """SHAPE_DIR/shape.json: which message, and how its records are made."""

    message: str  # the record's full name, pkg.Type
    proto: str  # the user's .proto file as given (for the manifest)
    generator: Generator
    sample: list[JsonRecord] | None  # the sample's records as canonical JSON; None: generated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> "ShapeFile":
        return cls(
            document["message"], document["proto"], Generator(**document["generator"]), document["sample"]
        )


# --- one field's mapping: its neutral value to JSON, into a message, from a message, from JSON


@dataclass
class _Field:
    descriptor: FieldDescriptor
    name: str
    json_name: str
    presence: bool  # absent reads as None (proto3 optional, a oneof member, a message field)
    to_json: Callable[[Any], Any] | None  # None: the value is its JSON
    fill: Callable[[Message, Any], None]
    read: Callable[[Message], Any]
    decode: Callable[[Any, str, int], Any]  # (a JSON value, its place, depth) -> the neutral value
    default: Any  # what an absent field without presence holds
    sub: "_MessageCodec | None" = None  # a message field's (or a map's message values') codec


class _MessageCodec:
    """A message's fields, each mapped one way and back; the record's codec and its nested ones."""

    def __init__(self, descriptor: Descriptor) -> None:
        self.descriptor = descriptor
        self.fields: list[_Field] = []
        self._names: dict[str, _Field] = {}
        self._oneofs = [oneof for oneof in descriptor.oneofs if len(oneof.fields) > 1]

    def to_json(self, record: Sequence[Any]) -> JsonRecord:
        """Canonical JSON: a field without presence at its default is left out, as json_format does."""
        out: JsonRecord = {}
        for field, value in zip(self.fields, record, strict=True):
            if value is None or (not value and not field.presence):
                continue
            convert = field.to_json
            out[field.json_name] = value if convert is None else convert(value)
        return out

    def fill(self, message: Message, record: Sequence[Any]) -> Message:
        for field, value in zip(self.fields, record, strict=True):
            if value is None or (not value and not field.presence):
                continue
            field.fill(message, value)
        return message

    def from_message(self, message: Message) -> tuple[Any, ...]:
        return tuple([field.read(message) for field in self.fields])

    def decode(self, value: Any, place: str, depth: int = 0) -> tuple[Any, ...]:
        """A JSON object as this message's neutral record; BadRequest naming the first wrong place."""
        if type(value) is not dict:
            raise BadRequest(f"{place}: expected an object")
        if depth > MAX_DEPTH:
            raise BadRequest(f"{place}: nested deeper than {MAX_DEPTH} messages")
        by_field: dict[str, Any] = {}
        for key, item in value.items():
            field = self._names.get(key)
            if field is None:
                raise BadRequest(f"{place}.{key}: unknown field")
            if field.name in by_field:
                raise BadRequest(f"{place}.{key}: given twice")
            by_field[field.name] = item
        record = []
        for field in self.fields:
            item = by_field.get(field.name)
            if item is None:
                record.append(None if field.presence else field.default)
            else:
                record.append(field.decode(item, f"{place}.{field.json_name}", depth))
        for oneof in self._oneofs:
            members = [f.json_name for f in oneof.fields if by_field.get(f.name) is not None]
            if len(members) > 1:
                raise BadRequest(f"{place}: {' and '.join(members)} are members of one oneof ({oneof.name})")
        return tuple(record)


def _codecs(record: Descriptor) -> _MessageCodec:
    """The record's codec, and its nested messages' (one per message type: recursion allowed)."""
    made: dict[str, _MessageCodec] = {}

    def codec(descriptor: Descriptor) -> _MessageCodec:
        if descriptor.full_name in made:
            return made[descriptor.full_name]
        built = made[descriptor.full_name] = _MessageCodec(descriptor)
        for field in descriptor.fields:
            built.fields.append(_field(field, codec))
        built._names = {name: f for f in built.fields for name in (f.json_name, f.name)}
        return built

    return codec(record)


def _field(field: FieldDescriptor, codec: Callable[[Descriptor], _MessageCodec]) -> _Field:
    name = field.name
    if _is_map(field):
        return _map_field(field, codec)
    repeated = _is_repeated(field)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        sub = codec(_message_type(field))
        if repeated:

            def fill_messages(message: Message, values: Any) -> None:
                add = getattr(message, name).add
                for value in values:
                    sub.fill(add(), value)

            return _collection(
                field,
                lambda values: [sub.to_json(v) for v in values],
                fill_messages,
                lambda message: tuple([sub.from_message(m) for m in getattr(message, name)]),
                lambda value, place, depth: tuple(
                    sub.decode(v, f"{place}[{i}]", depth + 1) for i, v in enumerate(_array(value, place))
                ),
                sub=sub,
            )

        def fill_message(message: Message, value: Any) -> None:
            part = getattr(message, name)
            part.SetInParent()
            sub.fill(part, value)

        return _Field(
            field,
            name,
            field.json_name,
            True,
            sub.to_json,
            fill_message,
            lambda message: sub.from_message(getattr(message, name)) if message.HasField(name) else None,
            lambda value, place, depth: sub.decode(value, place, depth + 1),
            None,
            sub,
        )
    to_json, decode, default = _scalar(field)
    if repeated:

        def fill_scalars(message: Message, values: Any) -> None:
            getattr(message, name).extend(values)

        return _collection(
            field,
            (lambda values: [to_json(v) for v in values]) if to_json is not None else list,
            fill_scalars,
            lambda message: tuple(getattr(message, name)),
            lambda value, place, depth: tuple(
                decode(v, f"{place}[{i}]") for i, v in enumerate(_array(value, place))
            ),
        )

    def set_scalar(message: Message, value: Any) -> None:
        setattr(message, name, value)

    presence = field.has_presence
    return _Field(
        field,
        name,
        field.json_name,
        presence,
        to_json,
        set_scalar,
        (lambda message: getattr(message, name) if message.HasField(name) else None)
        if presence
        else (lambda message: getattr(message, name)),
        lambda value, place, depth: decode(value, place),
        default,
    )


def _collection(
    field: FieldDescriptor,
    to_json: Callable[[Any], Any],
    fill: Callable[[Message, Any], None],
    read: Callable[[Message], Any],
    decode: Callable[[Any, str, int], Any],
    *,
    sub: _MessageCodec | None = None,
) -> _Field:
    """A repeated field or a map: no presence, empty when absent."""
    return _Field(field, field.name, field.json_name, False, to_json, fill, read, decode, (), sub)


def _map_field(field: FieldDescriptor, codec: Callable[[Descriptor], _MessageCodec]) -> _Field:
    """A map: neutral as its (key, value) pairs sorted by key (a protobuf map keeps no order)."""
    name = field.name
    key_field, value_field = (
        _message_type(field).fields_by_name["key"],
        _message_type(field).fields_by_name["value"],
    )
    key_json, key_decode = _map_key(key_field)
    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
        sub = codec(_message_type(value_field))

        def fill_messages(message: Message, pairs: Any) -> None:
            entries = getattr(message, name)
            for key, value in pairs:
                sub.fill(entries[key], value)

        return _collection(
            field,
            lambda pairs: {key_json(k): sub.to_json(v) for k, v in pairs},
            fill_messages,
            lambda message: tuple(
                sorted((k, sub.from_message(v)) for k, v in getattr(message, name).items())
            ),
            lambda value, place, depth: tuple(
                sorted(
                    (key_decode(k, f"{place}[{k!r}]"), sub.decode(v, f"{place}.{k}", depth + 1))
                    for k, v in _object(value, place).items()
                )
            ),
            sub=sub,
        )
    value_json, value_decode, _ = _scalar(value_field)
    convert = value_json if value_json is not None else (lambda value: value)

    def fill_scalars(message: Message, pairs: Any) -> None:
        getattr(message, name).update(pairs)

    return _collection(
        field,
        lambda pairs: {key_json(k): convert(v) for k, v in pairs},
        fill_scalars,
        lambda message: tuple(sorted(getattr(message, name).items())),
        lambda value, place, depth: tuple(
            sorted(
                (key_decode(k, f"{place}[{k!r}]"), value_decode(v, f"{place}.{k}"))
                for k, v in _object(value, place).items()
            )
        ),
    )


def _scalar(field: FieldDescriptor) -> tuple[Callable[[Any], Any] | None, Callable[[Any, str], Any], Any]:
    """A scalar's (to JSON, None when the value is its JSON; from JSON; default)."""
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        bits = 64 if high > 2**32 else 32

        def decode_int(value: Any, place: str) -> int:
            if (type(value) is str and value.lstrip("-").isdigit() and value.isascii()) or (
                type(value) is float and value.is_integer()
            ):
                value = int(value)
            if type(value) is not int:
                raise BadRequest(f"{place}: expected an integer")
            if not low <= value <= high:
                raise BadRequest(f"{place}: out of range for a {'' if low else 'u'}int{bits}")
            return value

        return (str if kind in _INT64 else None), decode_int, 0
    if kind in _FLOATS:
        single = kind == FieldDescriptor.TYPE_FLOAT

        def decode_float(value: Any, place: str) -> float:
            if type(value) is str and value in _NON_FINITE:
                return _NON_FINITE[value]
            if type(value) is not float and type(value) is not int:
                raise BadRequest(f"{place}: expected a number")
            number = float(value)
            if single:
                if math.isfinite(number) and abs(number) > _FLOAT32_MAX:
                    raise BadRequest(f"{place}: out of range for a float")
                number = _float32(number)
            return number

        # The pool's numbers are finite (the generator's, and a sample's: user_proto checks), so their
        # JSON is the number itself.
        return None, decode_float, 0.0
    if kind == FieldDescriptor.TYPE_BOOL:

        def decode_bool(value: Any, place: str) -> bool:
            if type(value) is not bool:
                raise BadRequest(f"{place}: expected true or false")
            return value

        return None, decode_bool, False
    if kind == FieldDescriptor.TYPE_STRING:

        def decode_string(value: Any, place: str) -> str:
            if type(value) is not str:
                raise BadRequest(f"{place}: expected a string")
            return value

        return None, decode_string, ""
    if kind == FieldDescriptor.TYPE_BYTES:

        def decode_bytes(value: Any, place: str) -> bytes:
            if type(value) is not str:
                raise BadRequest(f"{place}: expected a base64 string")
            try:  # json_format takes either alphabet, padded or not
                return base64.b64decode(
                    value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True
                )
            except (binascii.Error, ValueError):
                raise BadRequest(f"{place}: not base64") from None

        return (lambda value: base64.b64encode(value).decode("ascii")), decode_bytes, b""
    if kind == FieldDescriptor.TYPE_ENUM:
        enum = _enum_type(field)
        names = {value.number: value.name for value in enum.values}
        numbers = {value.name: value.number for value in enum.values}
        closed = enum.is_closed

        def decode_enum(value: Any, place: str) -> int:
            if type(value) is str and value in numbers:
                return numbers[value]
            if type(value) is int and (value in names or (not closed and -(2**31) <= value < 2**31)):
                return value
            raise BadRequest(f"{place}: expected one of {', '.join(numbers)}")

        return (lambda number: names.get(number, number)), decode_enum, 0
    raise UserMessageError(f"{field.full_name}: field type {kind} is not served")


def _map_key(field: FieldDescriptor) -> tuple[Callable[[Any], str], Callable[[str, str], Any]]:
    """A map key's (to its JSON object key, from it)."""
    if field.type == FieldDescriptor.TYPE_STRING:
        return (lambda key: key), lambda key, place: key
    if field.type == FieldDescriptor.TYPE_BOOL:

        def decode_bool(key: str, place: str) -> bool:
            if key not in ("true", "false"):
                raise BadRequest(f"{place}: expected true or false")
            return key == "true"

        return (lambda key: "true" if key else "false"), decode_bool
    _, decode, _ = _scalar(field)
    return str, decode


def _array(value: Any, place: str) -> list[Any]:
    if type(value) is not list:
        raise BadRequest(f"{place}: expected an array")
    return value


def _object(value: Any, place: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise BadRequest(f"{place}: expected an object")
    return value


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    return (
        _is_repeated(field)
        and field.type == FieldDescriptor.TYPE_MESSAGE
        and _message_type(field).GetOptions().map_entry
    )


def _message_type(field: FieldDescriptor) -> Descriptor:
    """A message or map field's message type (the stubs allow None, which such a field never has)."""
    assert field.message_type is not None, field.full_name
    return field.message_type


def _enum_type(field: FieldDescriptor) -> EnumDescriptor:
    assert field.enum_type is not None, field.full_name
    return field.enum_type


def _float32(value: float) -> float:
    number: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return number


# --- what the lab refuses, and the records it makes


def refusals(record: Descriptor) -> list[str]:
    """Why the lab cannot serve this message on every stack, one reason per feature, named."""
    if record.full_name.startswith(f"{_WELL_KNOWN_PACKAGE}."):
        return [f"{record.full_name} is a well-known type, whose JSON form is its own: not served"]
    if not record.fields:
        return [f"{record.full_name} has no fields: a record of it would carry nothing"]
    problems: list[str] = []
    seen: set[str] = set()

    def walk(descriptor: Descriptor) -> None:
        if descriptor.full_name in seen:
            return
        seen.add(descriptor.full_name)
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_GROUP:
                problems.append(f"{field.full_name}: a group (proto2) is not served")
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                sub = _message_type(field)
                if sub.full_name.startswith(f"{_WELL_KNOWN_PACKAGE}."):
                    problems.append(
                        f"{field.full_name}: {sub.full_name} is a well-known type, whose JSON form is its own"
                        " (Any holds a type URL): not served"
                    )
                else:
                    walk(sub)

    walk(record)
    return problems


def generate(codec: _MessageCodec, choices: Generator, size: int, seed: int) -> list[tuple[Any, ...]]:
    """size neutral records drawn by a Random of seed: the same (message, choices, size, seed) give
    the same records in any process."""
    rng = random.Random(seed)
    letters = string.ascii_letters + string.digits

    def scalar(field: FieldDescriptor, index: int) -> Any:
        kind = field.type
        if kind in _INT_RANGES:
            return rng.randrange(0, 2**53 if _INT_RANGES[kind][1] > 2**32 else 2**31)
        if kind == FieldDescriptor.TYPE_DOUBLE:
            return round(rng.uniform(0, 1e6), 3)
        if kind == FieldDescriptor.TYPE_FLOAT:
            return _float32(round(rng.uniform(0, 1e6), 3))
        if kind == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if kind == FieldDescriptor.TYPE_STRING:
            # A map's string keys differ by their index, at the stated length.
            text = "".join(rng.choices(letters, k=choices.string_chars))
            return text if index < 0 else f"{index}-{text}"[: max(choices.string_chars, len(str(index)) + 1)]
        if kind == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(choices.string_chars)
        if kind == FieldDescriptor.TYPE_ENUM:
            return rng.choice([value.number for value in _enum_type(field).values])
        raise UserMessageError(f"{field.full_name}: field type {kind} is not served")

    def record(message: _MessageCodec, level: int) -> tuple[Any, ...]:
        chosen = {
            oneof.name: rng.choice(oneof.fields).name
            for oneof in message.descriptor.oneofs
            if len(oneof.fields) > 1
        }
        values: list[Any] = []
        for field in message.fields:
            descriptor = field.descriptor
            oneof = descriptor.containing_oneof
            if oneof is not None and oneof.name in chosen and chosen[oneof.name] != field.name:
                values.append(None)
            else:
                values.append(value(field, level))
        return tuple(values)

    def value(field: _Field, level: int) -> Any:
        descriptor = field.descriptor
        if _is_map(descriptor):
            entry = _message_type(descriptor)
            key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
            if field.sub is not None and level >= choices.depth:
                return ()
            pairs = {}
            for index in range(choices.map_entries):
                key = _map_key_value(key_field, index, scalar)
                pairs[key] = (
                    record(field.sub, level + 1) if field.sub is not None else scalar(value_field, -1)
                )
            return tuple(sorted(pairs.items()))
        sub = field.sub
        if sub is not None:
            if level >= choices.depth:
                return () if _is_repeated(descriptor) else None
            if _is_repeated(descriptor):
                return tuple(record(sub, level + 1) for _ in range(choices.repeated))
            return record(sub, level + 1)
        if _is_repeated(descriptor):
            return tuple(scalar(descriptor, -1) for _ in range(choices.repeated))
        return scalar(descriptor, -1)

    return [record(codec, 0) for _ in range(size)]


def _map_key_value(field: FieldDescriptor, index: int, scalar: Callable[[FieldDescriptor, int], Any]) -> Any:
    """The index-th key of a generated map: distinct for each index."""
    if field.type == FieldDescriptor.TYPE_BOOL:
        return index % 2 == 1
    if field.type == FieldDescriptor.TYPE_STRING:
        return scalar(field, index)
    return index


def checksum(records: Iterable[Sequence[Any]]) -> int:
    """An upload reply's checksum: CRC-32 over each neutral record's repr, in order. A record decoded
    from JSON and the same record decoded from protobuf are equal tuples, so REST and gRPC agree."""
    total = 0
    for record in records:
        total = zlib.crc32(repr(record).encode(), total)
    return total


# --- the shape: loaded from SHAPE_DIR, installed where shape_kit and load_pool find it


@dataclass(frozen=True)
class UserMessage:
    """The user's message, loaded: its Shape, its file's choices and where they are."""

    directory: Path
    file: ShapeFile
    shape: Shape
    codec: _MessageCodec
    digest: str  # of the descriptor set and shape.json: the pool cache's key

    def pool(self, size: int, seed: int) -> list[JsonRecord]:
        """The pool as canonical JSON: the sample's records in order, repeated to size, or generated."""
        if self.file.sample is not None:
            sample = self.file.sample
            return [sample[index % len(sample)] for index in range(size)]
        return [
            self.codec.to_json(record) for record in generate(self.codec, self.file.generator, size, seed)
        ]

    def describe(self) -> dict[str, Any]:
        """What the manifest says of it."""
        made = (
            "the sample's records, in order" if self.file.sample is not None else asdict(self.file.generator)
        )
        return {
            "message": self.file.message,
            "proto": self.file.proto,
            "descriptor_set_sha256": self.digest,
            "records": made,
            "sample_records": None if self.file.sample is None else len(self.file.sample),
        }


def message_pool(descriptor_set: bytes) -> descriptor_pool.DescriptorPool:
    """A descriptor pool of its own holding a FileDescriptorSet's files (the default pool keeps the lab's
    cars.proto, which the set holds too)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


def load(directory: Path) -> UserMessage:
    """SHAPE_DIR's message as a Shape; UserMessageError when it cannot be served."""
    try:
        descriptor_set = (directory / DESCRIPTOR_SET).read_bytes()
        shape_bytes = (directory / SHAPE_FILE).read_bytes()
        file = ShapeFile.from_json(orjson.loads(shape_bytes))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as error:
        raise UserMessageError(
            f"SHAPE_DIR={directory}: not a shape written by the runner ({error})"
        ) from None
    pool = message_pool(descriptor_set)
    try:
        record = pool.FindMessageTypeByName(file.message)
    except KeyError:
        raise UserMessageError(f"message {file.message} is not in {directory / DESCRIPTOR_SET}") from None
    problems = refusals(record)
    if problems:
        raise UserMessageError(problems[0])
    codec = _codecs(record)
    record_message = message_factory.GetMessageClass(record)
    shape = Shape(
        USER_SHAPE,
        pool.FindServiceByName(SERVICE),
        record_message,
        message_factory.GetMessageClass(pool.FindMessageTypeByName(LIST_MESSAGE)),
        message_factory.GetMessageClass(pool.FindMessageTypeByName(CREATE_MESSAGE)),
        lambda item: codec.decode(item, "record"),
        lambda records: [codec.to_json(record) for record in records],
        codec.fill,
        codec.from_message,
        checksum,
        codec.decode,
    )
    digest = hashlib.sha256(descriptor_set + shape_bytes).hexdigest()
    return UserMessage(directory, file, shape, codec, digest)


_installed: list[UserMessage] = []


def install(directory: Path) -> UserMessage:
    """Load SHAPE_DIR's message and make it the shape `proto` of this process: shape_kit("proto")
    returns it, load_pool(size, seed, "proto") its pool."""
    user = load(directory)
    SHAPE_KITS[USER_SHAPE] = user.shape
    record_pool.register_shape(USER_SHAPE, user.pool, user.digest[:16])
    _installed[:] = [user]
    return user


def uninstall() -> None:
    """Undo install(): the process serves the built-in shapes only again. A server never needs it
    (one shape for its life); a process that prepares several runs' messages in turn does (the tests)."""
    SHAPE_KITS.pop(USER_SHAPE, None)
    record_pool.unregister_shape(USER_SHAPE)
    _installed.clear()


def installed() -> UserMessage | None:
    """The message install() made the shape `proto` of this process, if any."""
    return _installed[0] if _installed else None
