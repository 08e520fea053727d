"""`value_format: protobuf`, without a broker: values framed by confluent-kafka's own
`ProtobufSerializer` (magic byte 0, the schema id, the message indexes, the message) against a
Schema Registry over HTTP (the test double, or SCHEMA_REGISTRY_URL). The writer schema is read
both as the serializer registers it (a serialized FileDescriptorProto) and as `.proto` text, the
form a registry serves (compiled by grpcio-tools' protoc); the message classes that write the
records are made from the schema as txstream compiles it, the bytes and the frame by protobuf
and Confluent's serializer."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format
from support.registry_values import (
    ORDERS,
    Compiled,
    ProtobufProducer,
    columns,
    json_order,
    message_class,
)

from txstream.schemas.sources import SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import RawRecords
from txstream.sources.registry.client import RegistrySchemas
from txstream.sources.registry.framed import SchemaUnusable, WriterSchema
from txstream.sources.registry.protobuf import ProtobufValues


def order_proto(*fields: str) -> str:
    """The orders' schema as `.proto` text, `fields` added to (or, as `-name`, removed
    from) its message."""
    body = {"id": "int64 id = 1;", "customer": "string customer = 2;",
            "amount": "confluent.type.Decimal amount = 3;",
            "placed_at": "google.protobuf.Timestamp placed_at = 4;", "day": "string day = 5;",
            "note": "optional string note = 6;"}
    for f in fields:
        if f.startswith("-"):
            del body[f[1:]]
        else:
            body[f.split()[1]] = f
    return "\n".join([
        'syntax = "proto3";', "package shop;", 'import "google/protobuf/timestamp.proto";',
        'import "confluent/type/decimal.proto";',
        "message Order {", *body.values(),
        "  message Line { string sku = 1; int32 qty = 2; }", "}", ""])


def proto_order(i: int, **extra: Any) -> dict[str, Any]:
    """`json_order(i)` as protobuf's JSON mapping writes it (the decimal as Confluent's
    Decimal message: -123456789012 unscaled, scale 2)."""
    row = {**json_order(i), **extra}
    unscaled = (-123456789012).to_bytes(8, "big", signed=True)
    row["amount"] = {"value": base64.b64encode(unscaled).decode(), "precision": 12, "scale": 2}
    return {k: v for k, v in row.items() if v is not None}


def decode(url: str, topic: str, values: list[bytes | None], schema: TableSchema = ORDERS
           ) -> Any:
    spec = SourceSpec(name="orders", topic=topic, schema=schema, value_format="protobuf",
                      schema_registry_url=url)
    decoder = SourceDecoder(spec, RegistrySchemas(url))
    return decoder.decode(RawRecords.of(topic, values), list(range(len(values))))


def test_rows_read_as_from_json(registry_url: str) -> None:
    """Confluent's Decimal exactly, Timestamp with microseconds, an unset optional field as
    null: the same rows as the JSON documents give, from the serialized schema and from its
    `.proto` text alike."""
    producer = ProtobufProducer(registry_url)
    text = order_proto()
    values = producer.values(text, [proto_order(1), proto_order(2, note="gift")])
    assert values[0][0] == 0 and values[0][5] == 0  # magic byte; message indexes [0]
    as_json = SourceDecoder(SourceSpec(name="orders", topic=producer.topic, schema=ORDERS))
    expected = columns(as_json.decode(RawRecords.of(producer.topic, [
        json.dumps(json_order(i, note=note)).encode() for i, note in ((1, None), (2, "gift"))
    ]), [0, 1]))
    for framed in (values, producer.as_text(values, text)):
        batch = decode(registry_url, producer.topic, list(framed))
        assert batch.bad == []
        assert columns(batch) == expected


def test_a_nested_message(registry_url: str) -> None:
    """Message indexes [0, 0]: the first message nested in the first one."""
    producer = ProtobufProducer(registry_url)
    value, = producer.values(order_proto(), [{"sku": "a", "qty": 2}], 0, 0)
    assert value[5:8] == b"\x04\x00\x00"  # two indexes, zigzag-encoded
    lines = TableSchema.of({"sku": "text", "qty": "int"})
    batch = decode(registry_url, producer.topic, [value], lines)
    assert batch.bad == [] and batch.rows.select(["sku", "qty"]).to_pylist() == [
        {"sku": "a", "qty": 2}]


def test_schema_evolving_twice_needs_no_restart(registry_url: str) -> None:
    """A field added, then one removed: three schema ids, one decoder, no dead letter."""
    producer = ProtobufProducer(registry_url)
    values = (producer.values(order_proto(), [proto_order(1, note="a")])
              + producer.values(order_proto("string channel = 7;"),
                                [proto_order(2, note="b", channel="web")])
              + producer.values(order_proto("string channel = 7;", "-note"), [proto_order(3)]))
    assert len({v[1:5] for v in values}) == 3
    batch = decode(registry_url, producer.topic, list(values))
    assert batch.bad == []
    assert [(r["id"], r["note"]) for r in columns(batch)] == [(1, "a"), (2, "b"), (3, None)]


def test_unreadable_records_are_dead_lettered_with_their_bytes(registry_url: str
                                                               ) -> None:
    """An unknown schema id, a JSON Schema id, message indexes naming no message, a message
    cut short, `.proto` text that does not compile: each dead-lettered holding its original
    bytes. The good record is kept, and so is one whose proto3 `id` is 0: without `optional`,
    an unset field and its default are one and the same on the wire."""
    producer = ProtobufProducer(registry_url)
    good, no_id = producer.values(order_proto(), [proto_order(1),
                                                  {**proto_order(2), "id": 0}])
    json_id = producer.client.register_schema(f"{producer.topic}-json",
                                              Schema('{"type": "object"}', "JSON"))
    broken = producer.client.register_schema(f"{producer.topic}-broken",
                                             Schema("message Order { int64 id = ; }",
                                                    "PROTOBUF"))

    def with_id(schema_id: int) -> bytes:
        return good[:1] + schema_id.to_bytes(4, "big") + good[5:]

    values: list[bytes | None] = [
        b"\x00\x7f\xff\xff\xf0" + good[5:], with_id(json_id), good[:5] + b"\x02\x0a" + good[6:],
        good[:-3], with_id(broken), good, no_id]
    batch = decode(registry_url, producer.topic, values)
    assert [r["id"] for r in batch.rows.to_pylist()] == [1, 0]
    reasons = {b.offset: b.error for b in batch.bad}
    assert sorted(reasons) == [0, 1, 2, 3, 4]
    assert all(b.value == values[b.offset] for b in batch.bad)
    assert f"schema id {0x7ffffff0} is unknown" in reasons[0]
    assert "is a JSON schema; this source reads PROTOBUF" in reasons[1]
    assert "message indexes [5] name no message" in reasons[2]
    assert "Protobuf message does not decode" in reasons[3]
    assert f"schema id {broken}: the .proto text does not compile" in reasons[4]


def test_unset_optional_fields_are_left_out() -> None:
    """An unset `optional` field is not in the JSON (null: a primary key's record is then
    dead-lettered); a frame with no message indexes is no Protobuf frame."""
    cls = message_class('syntax = "proto3"; message K { optional int64 id = 1; }')
    values = ProtobufValues(Compiled('syntax = "proto3"; message K { optional int64 id = 1; }'))
    assert values.json_of(b"\x00\x00\x00\x00\x01\x00" + cls().SerializeToString()) == b"{}"
    with pytest.raises(ValueError, match="message indexes cut short"):
        values.json_of(b"\x00\x00\x00\x00\x01")


def test_an_unusable_schema_is_not_asked_again() -> None:
    """A registered schema never changes: one that does not compile is compiled once, and
    every later record naming it is refused for the same reason."""
    asked: list[int] = []

    class Counting(Compiled):
        def schema(self, schema_id: int) -> WriterSchema:
            asked.append(schema_id)
            return super().schema(schema_id)

    values = ProtobufValues(Counting("message Order { int64 id = ; }"))
    for _ in range(2):
        with pytest.raises(SchemaUnusable, match=r"schema id 1: the \.proto text does not compile"):
            values.json_of(b"\x00\x00\x00\x00\x01\x00")
    assert asked == [1]


COMMON_PROTO = """syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 cents = 2; }
"""
PRICED_PROTO = """syntax = "proto3";
package shop;
import "shop/common.proto";
message Priced { int64 id = 1; shop.common.Money price = 2; }
"""


def test_imports_of_other_subjects(registry_url: str) -> None:
    """A schema importing a file that the registry holds as another subject (a reference):
    resolved as `.proto` text, and as Confluent's serializer registers both, serialized."""
    producer = ProtobufProducer(registry_url)
    client = producer.client
    subject = f"{producer.topic}/shop/common.proto"
    client.register_schema(subject, Schema(COMMON_PROTO, "PROTOBUF"))
    priced_id = client.register_schema(f"{producer.topic}-value", Schema(
        PRICED_PROTO, "PROTOBUF", [SchemaReference("shop/common.proto", subject, 1)]))
    priced = ProtobufValues(RegistrySchemas(registry_url)).writer(priced_id).of((0,), priced_id)
    message = json_format.ParseDict({"id": 7, "price": {"currency": "EUR", "cents": 1250}},
                                    priced())
    as_text = b"\x00" + priced_id.to_bytes(4, "big") + b"\x00" + message.SerializeToString()
    serialize = ProtobufSerializer(priced, client, {"auto.register.schemas": True})
    serialized = serialize(message, SerializationContext(producer.topic, MessageField.VALUE))
    assert serialized[1:5] != as_text[1:5]  # registered again, with its import, serialized
    spec = SourceSpec(name="priced", topic=producer.topic, value_format="protobuf",
                      schema_registry_url=registry_url, fields={"currency": "price.currency",
                                                                "cents": "price.cents"},
                      schema=TableSchema.of({"id": "bigint", "currency": "text",
                                             "cents": "bigint"}))
    decoder = SourceDecoder(spec, RegistrySchemas(registry_url))
    batch = decoder.decode(RawRecords.of(producer.topic, [as_text, serialized]), [0, 1])
    assert batch.bad == []
    assert batch.rows.select(["id", "currency", "cents"]).to_pylist() == [
        {"id": 7, "currency": "EUR", "cents": 1250}] * 2
