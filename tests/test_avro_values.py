"""`value_format: avro`, without a broker: values written by confluent-kafka's own
`AvroSerializer` (Confluent's wire format) against a Schema Registry over HTTP, the test double
of `tests/support/schema_registry_double.py` or, with SCHEMA_REGISTRY_URL set, a real one;
decoded into the rows the same records give as JSON, and every record that cannot be read
dead-lettered with its original bytes and the reason."""

from __future__ import annotations

import io
import json
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from support.registry_values import (
    ENVELOPE,
    NULLABLE_TEXT,
    ORDER_FIELDS,
    ORDERS,
    TRANSACTION_METADATA,
    Producer,
    columns,
    metadata,
    order,
    record_schema,
)
from support.schema_registry_double import running_double

from txstream.schemas.sources import SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.sources.debezium.metadata import end_event
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import RawRecords
from txstream.sources.registry.avro import AvroValues
from txstream.sources.registry.client import (
    RegistrySchemas,
    SchemaRegistryUnavailable,
    SchemaUnavailable,
)
from txstream.sources.registry.framed import Reference, SchemaUnusable, WriterSchema, resolved


def source(url: str, topic: str, **settings: Any) -> SourceSpec:
    return SourceSpec(**{"name": "orders", "topic": topic, "schema": ORDERS,
                         "value_format": "avro", "schema_registry_url": url, **settings})


def decode(spec: SourceSpec, values: list[bytes | None], keys: list[bytes | None] | None = None,
           **retries: Any) -> Any:
    assert spec.schema_registry_url is not None
    decoder = SourceDecoder(spec, RegistrySchemas(spec.schema_registry_url, **retries))
    return decoder.decode(RawRecords.of(spec.topic, values, keys), list(range(len(values))))


def test_rows_read_as_from_json(registry_url: str) -> None:
    """Decimals (exact, negative), microsecond timestamps, dates, nullable unions: the same
    rows as the JSON form of the records."""
    producer = Producer(registry_url)
    values = producer.values(record_schema("Order", ORDER_FIELDS),
                             [order(1), order(2, note="gift")])
    assert values[0][0] == 0  # the wire format's magic byte
    batch = decode(source(registry_url, producer.topic), list(values))
    assert batch.bad == []
    as_json = SourceDecoder(SourceSpec(name="orders", topic=producer.topic, schema=ORDERS))
    json_rows = as_json.decode(RawRecords.of(producer.topic, [json.dumps(
        {**order(i, note=note), "amount": "-1234567890.12",
         "placed_at": "2026-11-26T10:30:00.123456Z", "day": "2026-02-28"}).encode()
        for i, note in ((1, None), (2, "gift"))]), [0, 1])
    assert columns(batch) == columns(json_rows)
    assert columns(batch)[1]["amount"] == Decimal("-1234567890.12")


def test_writer_schema_evolving_twice_needs_no_restart(registry_url: str) -> None:
    """A field added (with a default) then one removed: each record is read with its own
    writer schema by the same decoder; the removed nullable column reads as null."""
    producer = Producer(registry_url)
    v1 = record_schema("Order", ORDER_FIELDS)
    v2 = record_schema("Order", [*ORDER_FIELDS, {"name": "channel", "type": NULLABLE_TEXT,
                                                 "default": None}])
    v3 = record_schema("Order", [f for f in ORDER_FIELDS if f["name"] != "note"])
    values = (producer.values(v1, [order(1, note="a")])
              + producer.values(v2, [order(2, note="b", channel="web")])
              + producer.values(v3, [{k: v for k, v in order(3).items() if k != "note"}]))
    assert len({v[1:5] for v in values}) == 3  # three schema ids
    batch = decode(source(registry_url, producer.topic), list(values))
    assert batch.bad == []
    assert [(r["id"], r["note"]) for r in columns(batch)] == [(1, "a"), (2, "b"), (3, None)]


def test_debezium_avro_envelope(registry_url: str) -> None:
    """Debezium's envelope through AvroConverter: `before`/`after` as nullable records,
    `op`, `source.connector`, `transaction.id` with PostgreSQL's LSN; an upsert source reads
    the create as a row and the delete as a delete of its key, its tombstone as for JSON."""
    producer = Producer(registry_url)
    tx = {"id": "780:34131368", "total_order": 1, "data_collection_order": 1}
    src = {"connector": "postgresql", "txId": 780}
    values: list[bytes | None] = list(producer.values(ENVELOPE, [
        {"before": None, "after": order(1), "source": src, "op": "c", "ts_ms": 1,
         "transaction": tx},
        {"before": order(2), "after": None, "source": src, "op": "d", "ts_ms": 2,
         "transaction": {**tx, "total_order": 2, "data_collection_order": 2}},
    ]))
    spec = source(registry_url, producer.topic, format="debezium", semantics="upsert",
                  upstream={"metadata_topic": "dbserver1.transaction",
                            "data_collection": "public.orders"})
    batch = decode(spec, [*values, None], [b'{"id": 1}', b'{"id": 2}', b'{"id": 2}'])
    assert batch.bad == []
    rows = batch.rows.to_pylist()
    assert [(r["id"], r["__delete"], r["__upstream_id"]) for r in rows] == [
        (1, False, "780"), (2, True, "780"), (2, True, None)]
    assert rows[0]["amount"] == Decimal("-1234567890.12")
    assert batch.tombstones == [2]  # read as for JSON: a delete only if the key has a row


def test_transaction_metadata_in_avro(registry_url: str) -> None:
    """BEGIN and END events written with the changes' converter read as their JSON form."""
    producer = Producer(registry_url)
    begin, end = producer.values(TRANSACTION_METADATA, [metadata("BEGIN", "780:34131152"),
                                                        metadata("END", "780:34131464", 2)])
    avro = AvroValues(RegistrySchemas(registry_url))
    assert end_event(avro.json_of(begin), "postgresql") == (None, {})
    assert end_event(avro.json_of(end), "postgresql") == ("780", {"public.orders": 2})


def test_unreadable_records_are_dead_lettered_with_their_bytes(registry_url: str) -> None:
    """Not the wire format, an unknown schema id, a body cut short, a missing required
    key: each dead-lettered holding its original bytes, the good record kept."""
    producer = Producer(registry_url)
    good, = producer.values(record_schema("Order", ORDER_FIELDS), [order(1)])
    no_id, = producer.values(
        record_schema("Order", [f for f in ORDER_FIELDS if f["name"] != "id"]),
        [{k: v for k, v in order(2).items() if k != "id"}])
    values: list[bytes | None] = [b'{"id": 3}', b"\x00\x7f\xff\xff\xf0" + good[5:], good[:-4],
                                  good, b"\x00\x00", no_id]
    batch = decode(source(registry_url, producer.topic), values)
    assert [r["id"] for r in batch.rows.to_pylist()] == [1]
    reasons = {b.offset: b.error for b in batch.bad}
    assert sorted(reasons) == [0, 1, 2, 4, 5]
    assert all(b.value == values[b.offset] for b in batch.bad)
    assert "starts with byte 123" in reasons[0] and "magic byte 0" in reasons[0]
    assert f"schema id {0x7ffffff0} is unknown" in reasons[1]
    assert "does not decode with writer schema id" in reasons[2]
    assert "is empty" not in reasons[4] and "2 bytes" in reasons[4]
    assert "missing or null required field 'id'" in reasons[5]


def test_unreachable_registry() -> None:
    """Down at start: a typed error naming the URL. Down later: the records whose schema is not
    cached are dead-lettered after the client's retries, asked once per id and batch."""
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    with pytest.raises(SchemaRegistryUnavailable, match=r"127\.0\.0\.1:9 does not answer"):
        RegistrySchemas(url, **{"max.retries": 0}).check()
    value = b"\x00\x00\x00\x00\x01" + b"\x02"
    batch = decode(source(url, "orders"), [value, value], **{"max.retries": 0})
    assert [b.value for b in batch.bad] == [value, value]
    assert "unreachable for schema id 1 after retries" in batch.bad[0].error
    assert "replay this dead letter" in batch.bad[0].error


def test_basic_auth_from_the_environment() -> None:
    """SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO reaches the client; without it the registry's
    refusal is the dead letter's reason."""
    with running_double({"SCHEMA_REGISTRY_DOUBLE_USER_INFO": "tx:secret"}) as url:
        env = {"SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "tx:secret"}
        RegistrySchemas(url, env).check()
        with pytest.raises(SchemaRegistryUnavailable):
            RegistrySchemas(url, {}).check()
        schema_id = SchemaRegistryClient({"url": url, "basic.auth.user.info": "tx:secret"}
                                         ).register_schema(
            "t-value", Schema(record_schema("Order", ORDER_FIELDS), "AVRO"))
        with pytest.raises(SchemaUnavailable, match="refused schema id"):
            RegistrySchemas(url, {}).schema(schema_id)
        assert json.loads(RegistrySchemas(url, env).schema(schema_id).text)["name"] == "Order"


def test_settings_go_together() -> None:
    with pytest.raises(ValueError, match="schema_registry_url go together"):
        SourceSpec(name="o", topic="o", schema=ORDERS, value_format="avro")
    with pytest.raises(ValueError, match="schema_registry_url go together"):
        SourceSpec(name="o", topic="o", schema=ORDERS, value_format="json_schema")
    with pytest.raises(ValueError, match="schema_registry_url go together"):
        SourceSpec(name="o", topic="o", schema=ORDERS, schema_registry_url="http://r:8081")


def test_a_schema_importing_another_subject(registry_url: str) -> None:
    """A named type that the writer schema takes from another subject (a reference), as
    Confluent's serializers register shared types: resolved before the schema itself."""
    client = SchemaRegistryClient({"url": registry_url})
    money = {"type": "record", "name": "Money", "namespace": "shop", "fields": [
        {"name": "currency", "type": "string"}, {"name": "cents", "type": "long"}]}
    subject = f"shop.Money-{uuid.uuid4().hex[:8]}"
    client.register_schema(subject, Schema(json.dumps(money), "AVRO"))
    priced = {"type": "record", "name": "Priced", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "price", "type": "shop.Money"}]}
    schema_id = client.register_schema(f"{subject}-priced", Schema(
        json.dumps(priced), "AVRO", [SchemaReference("shop.Money", subject, 1)]))
    named: dict[str, Any] = {}
    fastavro.parse_schema(money, named_schemas=named)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(priced, named_schemas=named),
                               {"id": 7, "price": {"currency": "EUR", "cents": 1250}})
    spec = SourceSpec(name="priced", topic="priced", value_format="avro",
                      schema_registry_url=registry_url,
                      fields={"currency": "price.currency", "cents": "price.cents"},
                      schema=TableSchema.of({"id": "bigint", "currency": "text",
                                             "cents": "bigint"}))
    batch = SourceDecoder(spec, RegistrySchemas(registry_url)).decode(RawRecords.of(
        "priced", [b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()]), [0])
    assert batch.bad == []
    assert batch.rows.select(["id", "currency", "cents"]).to_pylist() == [
        {"id": 7, "currency": "EUR", "cents": 1250}]


def test_references_in_a_cycle_are_refused() -> None:
    class Cyclic:
        def version(self, subject: str, version: int) -> WriterSchema:
            return WriterSchema("{}", "AVRO", (Reference("b" if subject == "a" else "a",
                                                         "b" if subject == "a" else "a", 1),))

    with pytest.raises(SchemaUnusable, match="schema id 9 form a cycle: a -> b -> a"):
        resolved(Cyclic(), WriterSchema("{}", "AVRO", (Reference("a", "a", 1),)), 9)
