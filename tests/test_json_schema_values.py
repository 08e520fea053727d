"""`value_format: json_schema`, without a broker: values written by confluent-kafka's own
`JSONSerializer` (magic byte 0, the schema id, the JSON document) against a Schema Registry over
HTTP (the test double, or SCHEMA_REGISTRY_URL); read as the same documents without the frame
would be, and every record that cannot be read dead-lettered with its original bytes."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.schema_registry import Schema
from support.registry_values import (
    ORDER_FIELDS,
    ORDERS,
    JsonSchemaProducer,
    columns,
    json_order,
    record_schema,
)

from txstream.schemas.sources import SourceSpec
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import RawRecords
from txstream.sources.registry.client import RegistrySchemas

TEXT: Any = {"type": "string"}
ORDER_PROPERTIES: dict[str, Any] = {
    "id": {"type": "integer"}, "customer": TEXT, "amount": TEXT, "placed_at": TEXT, "day": TEXT,
    "note": {"oneOf": [{"type": "null"}, TEXT]}}


def json_schema(properties: dict[str, Any], required: list[str]) -> str:
    return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order",
                       "type": "object", "properties": properties, "required": required})


ORDER_SCHEMA = json_schema(ORDER_PROPERTIES, ["id", "customer", "amount", "placed_at", "day"])


def decode(url: str, topic: str, values: list[bytes | None]) -> Any:
    spec = SourceSpec(name="orders", topic=topic, schema=ORDERS, value_format="json_schema",
                      schema_registry_url=url)
    decoder = SourceDecoder(spec, RegistrySchemas(url))
    return decoder.decode(RawRecords.of(topic, values), list(range(len(values))))


def test_rows_read_as_the_unframed_json(registry_url: str) -> None:
    producer = JsonSchemaProducer(registry_url)
    records = [json_order(1), json_order(2, note="gift")]
    values = producer.values(ORDER_SCHEMA, records)
    assert values[0][0] == 0 and values[0][5:].startswith(b"{")  # the frame, then JSON
    batch = decode(registry_url, producer.topic, list(values))
    assert batch.bad == []
    as_json = SourceDecoder(SourceSpec(name="orders", topic=producer.topic, schema=ORDERS))
    plain = as_json.decode(RawRecords.of(producer.topic, [v[5:] for v in values]), [0, 1])
    assert columns(batch) == columns(plain) and len(columns(batch)) == 2


def test_schema_evolving_twice_needs_no_restart(registry_url: str) -> None:
    """A property added, then one removed: three schema ids, one decoder, no dead letter."""
    producer = JsonSchemaProducer(registry_url)
    required = ["id", "customer", "amount", "placed_at", "day"]
    v2 = json_schema({**ORDER_PROPERTIES, "channel": TEXT}, required)
    v3 = json_schema({k: v for k, v in ORDER_PROPERTIES.items() if k != "note"}, required)
    values = (producer.values(ORDER_SCHEMA, [json_order(1, note="a")])
              + producer.values(v2, [json_order(2, note="b", channel="web")])
              + producer.values(v3, [{k: v for k, v in json_order(3).items() if k != "note"}]))
    assert len({v[1:5] for v in values}) == 3
    batch = decode(registry_url, producer.topic, list(values))
    assert batch.bad == []
    assert [(r["id"], r["note"]) for r in columns(batch)] == [(1, "a"), (2, "b"), (3, None)]


def test_unreadable_records_are_dead_lettered_with_their_bytes(registry_url: str
                                                               ) -> None:
    """Unframed JSON, an unknown schema id, the id of an Avro schema, a document that is no
    JSON object, a document without the primary key (the declared columns govern, not the
    JSON Schema): each dead-lettered holding its original bytes."""
    producer = JsonSchemaProducer(registry_url)
    good, = producer.values(ORDER_SCHEMA, [json_order(1)])
    avro_id = producer.client.register_schema(
        f"{producer.topic}-avro", Schema(record_schema("Order", ORDER_FIELDS), "AVRO"))
    avro = b"\x00" + avro_id.to_bytes(4, "big") + good[5:]
    no_key = good[:5] + json.dumps({k: v for k, v in json_order(6).items() if k != "id"}
                                   ).encode()
    values: list[bytes | None] = [good[5:], b"\x00\x7f\xff\xff\xf0" + good[5:], avro,
                                  good[:5] + b"[1, 2]", no_key, good]
    batch = decode(registry_url, producer.topic, values)
    assert [r["id"] for r in batch.rows.to_pylist()] == [1]
    reasons = {b.offset: b.error for b in batch.bad}
    assert sorted(reasons) == [0, 1, 2, 3, 4]
    assert all(b.value == values[b.offset] for b in batch.bad)
    assert "not Confluent's wire format" in reasons[0] and "JSON Schema serializer" in reasons[0]
    assert f"schema id {0x7ffffff0} is unknown" in reasons[1]
    assert "is a AVRO schema; this source reads JSON" in reasons[2]
    assert "not an object" in reasons[3]
    assert "missing or null required field 'id'" in reasons[4]
