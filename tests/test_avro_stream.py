"""A Debezium stream in Confluent's wire format (AvroConverter, or JsonSchemaConverter, values;
JSON keys) through the transaction builder and the broker fixture, schemas from the Schema
Registry test double (or SCHEMA_REGISTRY_URL): snapshot reads in a mini-batch, then a
transaction (BEGIN and END framed alike on the metadata topic) holding an update, a delete and
its tombstone, as one stream transaction; a record naming an unknown schema id lands in the
dead-letter topic byte for byte, with its reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kafka_helpers import (  # noqa: F401 (fixtures by name)
    builders_fixture,
    dlq_fixture,
    integrate,
    make_builder,
    poll_until,
    produce,
    read_dead_letters,
)
from test_avro_values import (  # noqa: F401 (registry_url: a fixture by name)
    ENVELOPE,
    ORDERS,
    TRANSACTION_METADATA,
    Producer,
    metadata,
    order,
    registry_url,
)
from test_json_schema_values import JsonSchemaProducer, json_order

from txstream.schemas.sources import SourceSpec, UpstreamTransactions
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.sources.transactions import TransactionBuilder


def change(op: str, before: dict | None, after: dict | None, txid: str | None = None,
           order_in_tx: int = 1) -> dict[str, Any]:
    tx = None if txid is None else {"id": txid, "total_order": order_in_tx,
                                    "data_collection_order": order_in_tx}
    return {"before": before, "after": after, "op": op, "ts_ms": 1, "transaction": tx,
            "source": {"connector": "postgresql", "txId": 780}}


def key(i: int) -> bytes:
    return b'{"id": %d}' % i


def any_object(title: str) -> str:
    """A JSON Schema every object passes (the serializer validates against it)."""
    return json.dumps({"title": title, "type": "object"})


@dataclass(frozen=True)
class Framing:
    value_format: str
    producer: type[Producer]
    envelope: str  # the change events' schema
    metadata: str  # the transaction metadata's schema
    order: Callable[..., dict[str, Any]]
    # JsonSchemaConverter keeps decimals as the connector wrote them: here as text.
    settings: dict[str, Any]


FRAMINGS = [
    Framing("avro", Producer, ENVELOPE, TRANSACTION_METADATA, order, {}),
    Framing("json_schema", JsonSchemaProducer, any_object("Envelope"),
            any_object("TransactionMetadataValue"), json_order,
            {"decimal_handling_mode": "string"}),
]


@pytest.mark.parametrize("framing", FRAMINGS, ids=lambda f: f.value_format)
def test_debezium_framed_stream(kafka: KafkaEndpoint, registry_url: str,  # noqa: F811
                                dlq: str, builders: list[TransactionBuilder],
                                framing: Framing) -> None:
    producer = framing.producer(registry_url)
    row = framing.order
    meta = f"{producer.topic}.transaction"
    kafka.create_topic(producer.topic, 1)
    kafka.create_topic(meta, 1)
    spec = SourceSpec(name="orders", topic=producer.topic, schema=ORDERS, format="debezium",
                      semantics="upsert", value_format=framing.value_format,
                      schema_registry_url=registry_url, **framing.settings,
                      upstream=UpstreamTransactions(metadata_topic=meta,
                                                    data_collection="public.orders"))
    builders.append(b := make_builder(kafka, [spec], dlq))
    snapshot = producer.values(framing.envelope,
                               [change("r", None, row(i)) for i in (1, 2, 3)])
    produce(kafka, producer.topic, [(key(i), v) for i, v in zip((1, 2, 3), snapshot,
                                                                 strict=True)])
    txs = poll_until(b, lambda ts: len(ts) == 1)
    update, delete = producer.values(framing.envelope, [
        change("u", row(1), row(1, note="gift"), "780:34131368", 1),
        change("d", row(3), None, "780:34131400", 2)])
    unknown = b"\x00\x7f\xff\xff\xf0" + update[5:]
    begin, end = producer.values(framing.metadata, [metadata("BEGIN", "780:34131152"),
                                                        metadata("END", "780:34131464", 2)])
    produce(kafka, meta, [(None, begin)])
    produce(kafka, producer.topic, [(key(1), update), (key(2), unknown), (key(3), delete),
                                    (key(3), None)])
    produce(kafka, meta, [(None, end)])
    txs += poll_until(b, lambda ts: any(t.upstream_id == "780" for t in ts), deadline_s=20)
    assert [t.upstream_id for t in txs if t.upstream_id is not None] == ["780"]
    assert b.stats.incomplete_upstream == 0
    final = {dict(r)["id"]: dict(r) for r in integrate(txs, "orders")}
    assert {i: r["note"] for i, r in final.items()} == {1: "gift", 2: None}
    dead, = read_dead_letters(kafka, dlq, 1)
    assert dead["value"] == unknown and dead["key"] == key(2)
    assert "schema id 2147483632 is unknown" in dead["txstream.error"]
