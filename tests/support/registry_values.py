"""Values as producers with the Schema Registry's serializers write them (confluent-kafka's own
`AvroSerializer`, `JSONSerializer` and `ProtobufSerializer`, Confluent's wire format), and the
schemas they write with: the orders of the registry tests (`ORDERS`, `order`, `json_order`) and
Debezium's envelope and transaction metadata as AvroConverter registers them."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format
from google.protobuf.message import Message

from txstream.schemas.tables import TableSchema
from txstream.sources.registry.framed import WriterSchema
from txstream.sources.registry.protobuf import ProtobufValues

ORDERS = TableSchema.of({"id": "bigint", "customer": "text", "amount": "decimal(12,2)",
                         "placed_at": "timestamp", "day": "date", "note": "text"},
                        primary_key=["id"])


def record_schema(name: str, fields: list[dict[str, Any]]) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "test", "fields": fields})


NULLABLE_TEXT: Any = ["null", "string"]
ORDER_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "note", "type": NULLABLE_TEXT, "default": None},
]


ROW_SCHEMA = {"type": "record", "name": "Value", "namespace": "dbserver1.public.orders",
              "fields": ORDER_FIELDS}
# Debezium's envelope as AvroConverter registers it (the fields txstream reads).
ENVELOPE = record_schema("Envelope", [
    {"name": "before", "type": ["null", ROW_SCHEMA], "default": None},
    {"name": "after", "type": ["null", "dbserver1.public.orders.Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
        {"name": "connector", "type": "string"}, {"name": "txId", "type": "long"}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}]}], "default": None},
])


# Debezium's transaction metadata events as AvroConverter registers them
# (io.debezium.connector.common.TransactionMetadataValue).
TRANSACTION_METADATA = record_schema("TransactionMetadataValue", [
    {"name": "status", "type": "string"}, {"name": "id", "type": "string"},
    {"name": "event_count", "type": ["null", "long"], "default": None},
    {"name": "data_collections", "type": ["null", {"type": "array", "items": {
        "type": "record", "name": "ConnectDefault", "fields": [
            {"name": "data_collection", "type": "string"},
            {"name": "event_count", "type": "long"}]}}], "default": None},
    {"name": "ts_ms", "type": "long"},
])


def metadata(status: str, txid: str, count: int = 0) -> dict[str, Any]:
    end = status == "END"
    return {"status": status, "id": txid, "ts_ms": 1486500577125,
            "event_count": count if end else None,
            "data_collections": [{"data_collection": "public.orders", "event_count": count}]
            if end else None}


class Producer:
    """Values as a producer with the Schema Registry's Avro serializer writes them, each
    schema registered under `<topic>-value` (a fresh topic per producer: a real registry keeps
    what earlier runs registered)."""

    def __init__(self, url: str) -> None:
        self.topic = f"orders-{uuid.uuid4().hex[:8]}"
        self.client = SchemaRegistryClient({"url": url})

    def values(self, schema: str, records: list[dict[str, Any]]) -> list[bytes]:
        serialize = AvroSerializer(self.client, schema, conf={"auto.register.schemas": True})
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return [serialize(r, ctx) for r in records]


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i}", "amount": Decimal("-1234567890.12"),
            "placed_at": datetime.datetime(2026, 11, 26, 10, 30, 0, 123456,
                                           tzinfo=datetime.UTC),
            "day": datetime.date(2026, 2, 28), "note": None, **extra}


def columns(batch: Any) -> list[dict[str, Any]]:
    return [{c: r[c] for c in ORDERS.names} for r in batch.rows.to_pylist()]


class JsonSchemaProducer(Producer):
    """Values as a producer with the Schema Registry's JSON Schema serializer writes them."""

    def values(self, schema: str, records: list[dict[str, Any]]) -> list[bytes]:
        serialize = JSONSerializer(schema, self.client, conf={"auto.register.schemas": True})
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return [serialize(r, ctx) for r in records]


def json_order(i: int, **extra: Any) -> dict[str, Any]:
    """`order(i)` as a JSON document."""
    return {"id": i, "customer": f"c{i}", "amount": "-1234567890.12",
            "placed_at": "2026-11-26T10:30:00.123456Z", "day": "2026-02-28", "note": None,
            **extra}


class Compiled:
    """One schema, as a registry holding only its text would serve it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def schema(self, schema_id: int) -> WriterSchema:
        return WriterSchema(self.text, "PROTOBUF")


def message_class(text: str, *indexes: int) -> type[Message]:
    return ProtobufValues(Compiled(text)).writer(1).of(indexes or (0,), 1)


class ProtobufProducer:
    """Values as a producer with the Schema Registry's Protobuf serializer writes them."""

    def __init__(self, url: str) -> None:
        self.topic = f"orders-{uuid.uuid4().hex[:8]}"
        self.client = SchemaRegistryClient({"url": url})

    def values(self, text: str, records: list[dict[str, Any]], *indexes: int) -> list[bytes]:
        cls = message_class(text, *indexes)
        serialize = ProtobufSerializer(cls, self.client, {"auto.register.schemas": True})
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return [serialize(json_format.ParseDict(r, cls()), ctx) for r in records]

    def as_text(self, values: list[bytes], text: str) -> list[bytes]:
        """`values` under the id of `text` registered as `.proto` text."""
        schema_id = self.client.register_schema(f"{self.topic}-text", Schema(text, "PROTOBUF"))
        return [v[:1] + schema_id.to_bytes(4, "big") + v[5:] for v in values]


def any_object(title: str) -> str:
    """A JSON Schema every object passes (the serializer validates against it)."""
    return json.dumps({"title": title, "type": "object"})
