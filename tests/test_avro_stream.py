"""A Debezium Avro stream (AvroConverter values, JSON keys) through the transaction builder and
the broker fixture, schemas from the Schema Registry test double (or SCHEMA_REGISTRY_URL):
snapshot reads in a mini-batch, then a transaction (BEGIN and END in Avro on the metadata
topic) holding an update, a delete and its tombstone, as one stream transaction; a record
naming an unknown schema id lands in the dead-letter topic byte for byte, with its reason."""

from __future__ import annotations

from typing import Any

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


def test_debezium_avro_stream(kafka: KafkaEndpoint, registry_url: str,  # noqa: F811
                              dlq: str, builders: list[TransactionBuilder]) -> None:
    producer = Producer(registry_url)
    meta = f"{producer.topic}.transaction"
    kafka.create_topic(producer.topic, 1)
    kafka.create_topic(meta, 1)
    spec = SourceSpec(name="orders", topic=producer.topic, schema=ORDERS, format="debezium",
                      semantics="upsert", value_format="avro", schema_registry_url=registry_url,
                      upstream=UpstreamTransactions(metadata_topic=meta,
                                                    data_collection="public.orders"))
    builders.append(b := make_builder(kafka, [spec], dlq))
    snapshot = producer.values(ENVELOPE, [change("r", None, order(i)) for i in (1, 2, 3)])
    produce(kafka, producer.topic, [(key(i), v) for i, v in zip((1, 2, 3), snapshot,
                                                                 strict=True)])
    txs = poll_until(b, lambda ts: len(ts) == 1)
    update, delete = producer.values(ENVELOPE, [
        change("u", order(1), order(1, note="gift"), "780:34131368", 1),
        change("d", order(3), None, "780:34131400", 2)])
    unknown = b"\x00\x7f\xff\xff\xf0" + update[5:]
    begin, end = producer.values(TRANSACTION_METADATA, [metadata("BEGIN", "780:34131152"),
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
