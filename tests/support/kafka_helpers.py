"""Shared helpers of the Kafka input tests: producing records, polling a builder with a bound
(one `Closed` per transaction), integrating transactions, reading the dead-letter topic."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from txstream.changes import DIFF, TIME
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.sources.transaction_batch import Transaction, TransactionBatch
from txstream.sources.transactions import TransactionBuilder

ORDERS = TableSchema.of({"id": "bigint", "item": "text", "qty": "int"}, primary_key=["id"])
FAST = BatchPolicy(max_events=1000, max_delay_ms=200, upstream_timeout_ms=3000)

Record = tuple[Any, Any] | tuple[Any, Any, list[tuple[str, bytes]]]

# (key, value) of an upsert source with max_value_bytes=200: five good records, then eight bad
# ones; `BAD_ORDER` interleaves them (the bad ones at offsets 1-4 and 7-10).
GOOD_RECORDS: list[Record] = [(str(i), {"id": i, "item": "ok", "qty": i}) for i in range(5)]
BAD_RECORDS: list[Record] = [
    ("10", b'{"id": 10, "item": "x", "qty": '),  # malformed JSON
    ("11", {"id": 11, "item": "x", "qty": "many"}),  # wrong type
    ("12", {"item": "x", "qty": 1}),  # missing non-nullable key column
    ("13", {"id": 13, "item": "x" * 300, "qty": 1}),  # oversize
    (None, {"id": 14, "item": "x", "qty": 1}),  # null key on an upsert source
    ("15", {"id": 15, "item": "x", "qty": 2**40}),  # int overflow
    ("16", b"[1, 2]"),  # not an object
    ("17", b""),  # empty value
]
BAD_ORDER: list[Record] = [GOOD_RECORDS[0], *BAD_RECORDS[:4], *GOOD_RECORDS[1:3],
                           *BAD_RECORDS[4:], *GOOD_RECORDS[3:]]
BAD_OFFSETS = [1, 2, 3, 4, 7, 8, 9, 10]


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


def make_builder(kafka: KafkaEndpoint, sources: list[SourceSpec], dlq: str | None = None,
                 policy: BatchPolicy = FAST) -> TransactionBuilder:
    return TransactionBuilder(kafka.bootstrap_servers, sources, group_id=uuid.uuid4().hex,
                              policy=policy, dead_letter_topic=dlq)


class Closed:
    """One closed transaction and its changes, cut from the batch a poll returned: reads as the
    `Transaction` (number, offsets, upstream_id, ranges, log_entry) plus `changes`, each source's
    table (empty when the transaction has no change of it)."""

    def __init__(self, batch: TransactionBatch, schemas: dict[str, pa.Schema]) -> None:
        assert len(batch) == 1
        self.transaction: Transaction = batch.last
        self.changes = {name: batch.changes[name].table if name in batch.changes
                        else schema.empty_table() for name, schema in schemas.items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transaction, name)


def closed(batch: TransactionBatch | None, builder: TransactionBuilder) -> list[Closed]:
    """The transactions of a polled batch, one by one."""
    schemas = {s.name: s.table_schema.arrow_schema(with_changes=True)
               for s in builder.sources}
    out: list[Closed] = []
    while batch is not None:
        one, batch = batch.split(1)
        out.append(Closed(one, schemas))
    return out


def poll_once(builder: TransactionBuilder, timeout: float) -> list[Closed]:
    """One poll's transactions, one by one."""
    return closed(builder.poll(timeout), builder)


def poll_until(builder: TransactionBuilder, done: Any, deadline_s: float = 10.0
               ) -> list[Closed]:
    """Poll until `done(transactions so far)`; bounded."""
    out: list[Closed] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out += closed(builder.poll(0.2), builder)
        if done(out):
            return out
    raise AssertionError(f"gave up after {deadline_s}s with {len(out)} transactions: "
                         f"{[(t.number, rows(t)) for t in out]}")


def rows(t: Closed, source: str | None = None) -> list[dict[str, Any]]:
    tables = [t.changes[source]] if source else list(t.changes.values())
    found = [r for table in tables for r in table.to_pylist()]
    return sorted(found, key=lambda r: (
        json.dumps({k: v for k, v in r.items() if k != DIFF}, sort_keys=True, default=str),
        r[DIFF],
    ))


def integrate(transactions: list[Closed], source: str) -> dict[tuple, int]:
    """The table after all the transactions, as a multiset of rows."""
    total: dict[tuple, int] = {}
    for t in transactions:
        for r in t.changes[source].to_pylist():
            assert r[TIME] == t.number
            row = tuple((k, v) for k, v in r.items() if k not in (TIME, DIFF))
            total[row] = total.get(row, 0) + r[DIFF]
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

