"""The record shape comes from proto/cars.proto's descriptor: services.common.contract reads it as
protobuf's own JSON mapping does, and the neutral records, their JSON mapping and the OpenAPI
schema agree with it."""

import typing

import jsonschema
import pytest
from faker import Faker
from google.protobuf import json_format

from services.common.contract import RECORD_SHAPE
from services.common.pb import cars_pb2
from services.common.records import JsonRecord, Record, fake_record, json_records, record_from_json
from services.common.rest import openapi_document


def faked_json_records(count: int) -> list[JsonRecord]:
    faker = Faker("en_US")
    faker.seed_instance(7)
    return json_records([fake_record(faker) for _ in range(count)])


def test_the_shape_is_protobufs_json_mapping() -> None:
    empty = cars_pb2.Record(car=cars_pb2.Car(), driver=cars_pb2.Driver())
    mapped = json_format.MessageToDict(empty, always_print_fields_with_no_presence=True)
    assert {key: {name: type(value) for name, value in part.items()} for key, part in mapped.items()} == {
        key: dict(shape.fields) for key, shape in RECORD_SHAPE.items()
    }
    assert [shape.name for shape in RECORD_SHAPE.values()] == [
        field.message_type.name for field in cars_pb2.Record.DESCRIPTOR.fields
    ]
    assert "driverId" in RECORD_SHAPE["driver"].fields  # JSON names, not the proto's driver_id


def test_neutral_records_have_the_protos_fields_in_its_order() -> None:
    record_fields = cars_pb2.Record.DESCRIPTOR.fields
    assert Record._fields == tuple(field.name for field in record_fields)
    parts = typing.get_type_hints(Record)
    for field, shape in zip(record_fields, RECORD_SHAPE.values(), strict=True):
        neutral = parts[field.name]
        assert neutral.__name__ == shape.name
        assert neutral._fields == tuple(f.name for f in field.message_type.fields)
        assert list(typing.get_type_hints(neutral).values()) == list(shape.fields.values())


def test_json_records_have_the_shape_and_map_back() -> None:
    for document in faked_json_records(20):
        assert list(document) == list(RECORD_SHAPE)
        for key, shape in RECORD_SHAPE.items():
            assert {name: type(value) for name, value in document[key].items()} == shape.fields
        assert json_records([record_from_json(document)]) == [document]


def test_the_openapi_record_schema_is_the_shape() -> None:
    document = openapi_document(max_count=10, default_count=5, max_request_bytes=1000)
    schema = {"$ref": "#/components/schemas/Record", "components": document["components"]}
    record = faked_json_records(1)[0]
    jsonschema.validate(record, schema)
    for key, shape in RECORD_SHAPE.items():
        for name in shape.fields:
            missing = {**record, key: {k: v for k, v in record[key].items() if k != name}}
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(missing, schema)


def test_the_openapi_upload_schema_takes_1_to_max_count_records_of_int32_numbers() -> None:
    document = openapi_document(max_count=10, default_count=5, max_request_bytes=1000)
    upload = {"$ref": "#/components/schemas/RecordUpload", "components": document["components"]}
    record = faked_json_records(1)[0]
    for count in (1, 10):
        jsonschema.validate({"records": [record] * count}, upload)
    for count in (0, 11):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"records": [record] * count}, upload)
    for year in (-(2**31), 2**31 - 1):
        jsonschema.validate({"records": [{**record, "car": {**record["car"], "year": year}}]}, upload)
    for year in (-(2**31) - 1, 2**31, True, "2020"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"records": [{**record, "car": {**record["car"], "year": year}}]}, upload)
    post = document["paths"]["/records"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RecordUpload"
    }
    assert set(post["responses"]) == {"200", "400", "413", "415"}
    assert "1000 bytes" in post["responses"]["413"]["description"]
