"""The record's JSON shape, read from the proto's descriptor (proto/cars.proto): the one source of it.

REST bodies use the protobuf canonical JSON mapping, so a record is an object of the
Record message's fields (car, driver), each an object of its message's fields, named by
their JSON names (driver_id -> driverId), with the JSON value types below. The OpenAPI
document and the runner's verification take the shape from here; k6's check and the
neutral records (services.common.records) are held to it by tests.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from services.common.pb import cars_pb2

# The Python type of a field's value in canonical JSON, for the field types the contract uses.
# (int64 would be a JSON string, so a new type must be added here deliberately.)
_JSON_TYPES: Mapping[int, type] = {FieldDescriptor.TYPE_STRING: str, FieldDescriptor.TYPE_INT32: int}


@dataclass(frozen=True)
class MessageShape:
    """One message of the record as a JSON object: its message name and fields."""

    name: str  # the message name, e.g. "Car"
    fields: Mapping[str, type]  # JSON name -> type of the JSON value (str or int), in field order


def _scalar_fields(message: Descriptor) -> dict[str, type]:
    fields = {}
    for field in message.fields:
        json_type = _JSON_TYPES.get(field.type)
        if json_type is None or field.is_repeated:
            raise TypeError(f"{field.full_name}: no JSON shape for this field type here")
        fields[field.json_name] = json_type
    return fields


def _record_shape(record: Descriptor) -> dict[str, MessageShape]:
    shape = {}
    for field in record.fields:
        if field.message_type is None or field.is_repeated:
            raise TypeError(f"{field.full_name}: a record's fields are single messages here")
        shape[field.json_name] = MessageShape(field.message_type.name, _scalar_fields(field.message_type))
    return shape


# {"car": MessageShape("Car", {"make": str, ..., "year": int, "mileage": int}),
#  "driver": MessageShape("Driver", {"firstname": str, "lastname": str, "driverId": str})}
RECORD_SHAPE: Mapping[str, MessageShape] = _record_shape(cars_pb2.DESCRIPTOR.message_types_by_name["Record"])
