"""Kafka input side against the broker fixture: formats, semantics, bad records, mini-batches."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from connectors.transactions import Transaction, TransactionBuilder
from schemas.sources import BatchPolicy, SourceSpec, UpstreamTransactions
from schemas.tables import TableSchema
from service.embedded.kafka import KafkaEndpoint

ORDERS = TableSchema.of({"id": "bigint", "item": "text", "qty": "int"}, primary_key=["id"])
FAST = BatchPolicy(max_events=1000, max_delay_ms=200, upstream_timeout_ms=3000)

Record = tuple[Any, Any] | tuple[Any, Any, list[tuple[str, bytes]]]


def _bytes(x: Any) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    return (x if isinstance(x, str) else json.dumps(x)).encode()


def produce(kafka: KafkaEndpoint, topic: str, records: list[Record], partition: int = 0) -> None:
    """(key, value[, headers]); dicts become JSON, None stays null."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for rec in records:
        key, value = rec[0], rec[1]
        headers = rec[2] if len(rec) > 2 else None  # type: ignore[misc]
        producer.produce(topic, key=_bytes(key), value=_bytes(value), headers=headers,
                         partition=partition)
    assert producer.flush(10) == 0


@pytest.fixture
def dlq(kafka: KafkaEndpoint) -> str:
    name = f"dlq-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, 1)
    return name


def make_builder(kafka: KafkaEndpoint, sources: list[SourceSpec], dlq: str | None = None,
                 policy: BatchPolicy = FAST) -> TransactionBuilder:
    return TransactionBuilder(kafka.bootstrap_servers, sources, group_id=uuid.uuid4().hex,
                              policy=policy, dead_letter_topic=dlq)


@pytest.fixture
def builders() -> Iterator[list[TransactionBuilder]]:
    made: list[TransactionBuilder] = []
    yield made
    for b in made:
        b.close()


def poll_until(builder: TransactionBuilder, done: Any, deadline_s: float = 10.0
               ) -> list[Transaction]:
    """Poll until `done(transactions so far)`; bounded."""
    out: list[Transaction] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out += builder.poll(0.2)
        if done(out):
            return out
    raise AssertionError(f"gave up after {deadline_s}s with {len(out)} transactions: "
                         f"{[(t.number, rows(t)) for t in out]}")


def rows(t: Transaction, source: str | None = None) -> list[dict[str, Any]]:
    tables = [t.changes[source]] if source else list(t.changes.values())
    found = [r for table in tables for r in table.to_pylist()]
    return sorted(found, key=lambda r: (
        json.dumps({k: v for k, v in r.items() if k != "diff"}, sort_keys=True, default=str),
        r["diff"],
    ))


def integrate(transactions: list[Transaction], source: str) -> dict[tuple, int]:
    """The table after all the transactions, as a multiset of rows."""
    total: dict[tuple, int] = {}
    for t in transactions:
        for r in t.changes[source].to_pylist():
            assert r["time"] == t.number
            row = tuple((k, v) for k, v in r.items() if k not in ("time", "diff"))
            total[row] = total.get(row, 0) + r["diff"]
    return {k: v for k, v in total.items() if v}


def read_dead_letters(kafka: KafkaEndpoint, topic: str, n: int) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                         "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[dict[str, Any]] = []
    end = time.monotonic() + 15
    try:
        while len(out) < n and time.monotonic() < end:
            m = consumer.poll(0.5)
            if m is None or m.error():
                continue
            headers = {k: v.decode() for k, v in m.headers() or ()}
            out.append({"value": m.value(), "key": m.key(), **headers})
    finally:
        consumer.close()
    return out


def n_events(n: int) -> Any:
    return lambda ts: sum(sum(t.num_rows for t in x.changes.values()) for x in ts) >= n


# ---- append_only and mini-batches ---------------------------------------------------------


def test_append_only_json_in_numbered_batches(kafka: KafkaEndpoint, topic_name: str,
                                               builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 2)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    builders.append(b := make_builder(kafka, [spec], policy=FAST.model_copy(
        update={"max_events": 4})))
    produce(kafka, topic_name, [(None, {"id": i, "item": f"x{i}", "qty": i}) for i in range(6)], 0)
    produce(kafka, topic_name, [(None, {"id": i, "item": f"x{i}", "qty": i}) for i in range(6, 10)],
            1)
    txs = poll_until(b, n_events(10))
    assert [t.number for t in txs] == list(range(1, len(txs) + 1))
    # Count-closed batches hold exactly max_events records; the rest closes on time.
    assert [sum(x.num_rows for x in t.changes.values()) for t in txs] == [4, 4, 2]
    assert txs[-1].changes["orders"].schema == ORDERS.arrow_schema(with_changes=True)
    assert integrate(txs, "orders") == {
        (("id", i), ("item", f"x{i}"), ("qty", i)): 1 for i in range(10)
    }
    assert txs[-1].offsets == {topic_name: {0: 6, 1: 4}}
    assert b.stats.events == 10 and b.stats.transactions == 3 and b.stats.bad_records == 0


def test_duplicate_rows_in_one_batch_are_consolidated(kafka: KafkaEndpoint, topic_name: str,
                                                      builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    builders.append(b := make_builder(kafka, [spec]))
    produce(kafka, topic_name, [(None, {"id": 1, "item": "a", "qty": 1})] * 3)
    txs = poll_until(b, lambda ts: len(ts) == 1)
    assert rows(txs[0]) == [{"id": 1, "item": "a", "qty": 1, "time": 1, "diff": 3}]


# ---- upsert -------------------------------------------------------------------------------


def test_upsert_emits_retractions_nets_and_deletes(kafka: KafkaEndpoint, topic_name: str,
                                                   builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert")
    builders.append(b := make_builder(kafka, [spec]))

    def row(i: int, item: str, qty: int) -> Record:
        return (str(i), {"id": i, "item": item, "qty": qty})

    produce(kafka, topic_name, [row(1, "a", 1), row(2, "b", 1), row(1, "a", 2)])
    t1 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t1[0]) == [
        {"id": 1, "item": "a", "qty": 2, "time": 1, "diff": 1},
        {"id": 2, "item": "b", "qty": 1, "time": 1, "diff": 1},
    ]
    # update 1, no-op on 2, tombstone 2 (its last record wins), delete of absent key 9.
    produce(kafka, topic_name, [row(1, "a", 5), row(2, "b", 1), (json.dumps({"id": 2}), None),
                                ("9", None), row(3, "c", 1)])
    t2 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t2[0]) == [
        {"id": 1, "item": "a", "qty": 2, "time": 2, "diff": -1},
        {"id": 1, "item": "a", "qty": 5, "time": 2, "diff": 1},
        {"id": 2, "item": "b", "qty": 1, "time": 2, "diff": -1},
        {"id": 3, "item": "c", "qty": 1, "time": 2, "diff": 1},
    ]
    assert b.stats.absent_deletes == 1
    produce(kafka, topic_name, [row(3, "c", 1)])
    t3 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t3[0]) == []  # an upsert that changes nothing emits nothing
    assert b.stats.unchanged_upserts == 1


def test_upsert_delete_marker_and_multi_transaction_poll(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert",
                      delete_field="deleted")
    builders.append(b := make_builder(kafka, [spec], policy=FAST.model_copy(
        update={"max_events": 2})))
    produce(kafka, topic_name, [
        ("1", {"id": 1, "item": "a", "qty": 1}), ("1", {"id": 1, "item": "a", "qty": 2}),  # T1
        ("1", {"id": 1, "item": "b", "qty": 2}), ("2", {"id": 2, "item": "z", "qty": 0}),  # T2
        ("1", {"id": 1, "deleted": True}), ("2", {"id": 2, "item": "z", "qty": 0}),  # T3
    ])
    txs = poll_until(b, lambda ts: len(ts) >= 3)
    assert [rows(t) for t in txs] == [
        [{"id": 1, "item": "a", "qty": 2, "time": 1, "diff": 1}],
        [{"id": 1, "item": "a", "qty": 2, "time": 2, "diff": -1},
         {"id": 1, "item": "b", "qty": 2, "time": 2, "diff": 1},
         {"id": 2, "item": "z", "qty": 0, "time": 2, "diff": 1}],
        [{"id": 1, "item": "b", "qty": 2, "time": 3, "diff": -1}],
    ]


# ---- bad input ----------------------------------------------------------------------------


def test_bad_records_are_dead_lettered_and_the_rest_flows(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert",
                      max_value_bytes=200)
    builders.append(b := make_builder(kafka, [spec], dlq))
    good = [(str(i), {"id": i, "item": "ok", "qty": i}) for i in range(5)]
    bad: list[Record] = [
        ("10", b'{"id": 10, "item": "x", "qty": '),  # malformed JSON
        ("11", {"id": 11, "item": "x", "qty": "many"}),  # wrong type
        ("12", {"item": "x", "qty": 1}),  # missing non-nullable key column
        ("13", {"id": 13, "item": "x" * 300, "qty": 1}),  # oversize
        (None, {"id": 14, "item": "x", "qty": 1}),  # null key on an upsert source
        ("15", {"id": 15, "item": "x", "qty": 2**40}),  # int overflow
        ("16", b"[1, 2]"),  # not an object
        ("17", b""),  # empty value
    ]
    produce(kafka, topic_name, [good[0], *bad[:4], good[1], good[2], *bad[4:], good[3], good[4]])
    with caplog.at_level(logging.WARNING, logger="connectors.transactions"):
        txs = poll_until(b, n_events(5))
    assert integrate(txs, "orders") == {
        (("id", i), ("item", "ok"), ("qty", i)): 1 for i in range(5)
    }
    assert b.stats.bad_records == len(bad) and b.stats.events == len(bad) + 5
    b.commit(txs[-1])
    letters = read_dead_letters(kafka, dlq, len(bad))
    assert sorted(int(x["txstream.offset"]) for x in letters) == [1, 2, 3, 4, 7, 8, 9, 10]
    by_offset = {int(x["txstream.offset"]): x for x in letters}
    assert by_offset[1]["value"] == b'{"id": 10, "item": "x", "qty": '
    assert "schema" in by_offset[1]["txstream.error"]
    assert "qty" in by_offset[2]["txstream.error"]
    assert "'id'" in by_offset[3]["txstream.error"]
    assert "max_value_bytes" in by_offset[4]["txstream.error"]
    assert "null message key" in by_offset[7]["txstream.error"]
    assert all(x["txstream.topic"] == topic_name and x["txstream.source"] == "orders"
               for x in letters)
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"{topic_name}/0@1" in w and "schema" in w for w in warned)


def test_spec_errors_tell_what_to_fix() -> None:
    with pytest.raises(ValueError, match="primary key"):
        SourceSpec(name="s", topic="t", schema=TableSchema.of({"a": "int"}), semantics="upsert")
    with pytest.raises(ValueError, match="declare it as bigint"):
        SourceSpec(name="s", topic="t", schema=TableSchema.of({"a": "int", "o": "text"}),
                   metadata={"o": "offset"})
    with pytest.raises(ValueError, match="not a column"):
        SourceSpec(name="s", topic="t", schema=ORDERS, fields={"nope": "a.b"})
    with pytest.raises(ValueError, match="exactly one"):
        UpstreamTransactions.model_validate({"id": {}})


def test_schema_alias_and_arrow_types() -> None:
    spec = SourceSpec(name="s", topic="t", schema=ORDERS)
    assert spec.schema is ORDERS and spec.table_schema is ORDERS
    assert pa.int32() == spec.schema.arrow_schema().field("qty").type
