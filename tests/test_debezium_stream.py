"""Streams in the exact shape Debezium writes them, through the transaction builder and the
broker fixture: PostgreSQL's 2.x transaction ids (`txId:LSN`, the LSN each event's own), a
snapshot then streaming, a tombstone after a delete, TOAST placeholders, a truncate; and
MySQL's GTIDs. Every source transaction is exactly one stream transaction, nothing is
dead-lettered."""

from __future__ import annotations

import json
from typing import Any

from support.debezium_records import (
    CUSTOMERS,
    NOTES,
    PHOTO,
    TOAST_BYTES,
    customer,
    flat,
    key,
    old_key_only,
)
from support.kafka_helpers import integrate, make_builder, poll_until, produce

from txstream.schemas.sources import UNAVAILABLE_VALUE, SourceSpec, UpstreamTransactions
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.sources.transactions import TransactionBuilder

TOAST = {"notes": UNAVAILABLE_VALUE, "photo": TOAST_BYTES}


def source_block(connector: str, txid: str | None, snapshot: str = "false") -> dict[str, Any]:
    """The `source` block of each connector's change events (postgresql.adoc and mysql.adoc,
    "Data change events"), the fields that vary here filled in. `snapshot`: `first`, `true`
    and `last` mark a snapshot's first, other and last read, `false` streaming."""
    if connector == "postgresql":
        tx, _, lsn = (txid or "0:34130000").partition(":")
        return {"version": "2.7.0.Final", "connector": "postgresql", "name": "dbserver1",
                "ts_ms": 1559033904863, "snapshot": snapshot,
                "db": "postgres", "schema": "inventory", "table": "customers",
                "txId": int(tx), "lsn": int(lsn), "xmin": None}
    return {"version": "2.7.0.Final", "connector": "mysql", "name": "mysql-server-1",
            "ts_ms": 1465581029100, "snapshot": snapshot, "db": "inventory",
            "table": "customers", "server_id": 223344, "gtid": txid,
            "file": "mysql-bin.000003", "pos": 484, "row": 0, "thread": 7, "query": None}


def change(connector: str, txid: str | None, op: str, before: dict | None,
           after: dict | None, order: int = 1, snapshot: str = "false") -> bytes:
    tx = None if txid is None else {"id": txid, "total_order": order,
                                    "data_collection_order": order}
    source = source_block(connector, txid, snapshot)
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "dbserver1.inventory.customers.Envelope"},
                       "payload": {"before": before, "after": after, "op": op,
                                   "ts_ms": 1559033904863, "source": source,
                                   "transaction": tx}}).encode()


def marker(status: str, txid: str, count: int = 0) -> bytes:
    """A BEGIN or END event of `<topic.prefix>.transaction` (with the converter's wrapper)."""
    end = status == "END"
    return json.dumps({"schema": {"type": "struct"}, "payload": {
        "status": status, "id": txid, "ts_ms": 1486500577125,
        "event_count": count if end else None,
        "data_collections": [{"data_collection": "inventory.customers", "event_count": count}]
        if end else None}}).encode()


def run(kafka: KafkaEndpoint, prefix: str, connector: str, dlq: str,
        builders: list[TransactionBuilder],
        transactions: list[tuple[str, list[str],
                                 list[tuple[int | None, str, dict | None, dict | None]]]]
        ) -> None:
    """A snapshot of customers 1001 and 1002, then `transactions` (BEGIN id, change ids,
    changes (key, or None for a truncate; op, before, after); END id: the last change id's
    transaction at a later position), one after the other as the connector writes them.
    Checks that each one is one stream transaction after the snapshot's, that nothing is
    dead-lettered, and the rows."""
    topic, meta = f"{prefix}.inventory.customers", f"{prefix}.transaction"
    kafka.create_topic(topic, 1)
    kafka.create_topic(meta, 1)
    spec = SourceSpec(name="customers", topic=topic, schema=CUSTOMERS, format="debezium",
                      semantics="upsert",
                      upstream=UpstreamTransactions(metadata_topic=meta,
                                                    data_collection="inventory.customers"))
    builders.append(b := make_builder(kafka, [spec], dlq))
    produce(kafka, topic, [(key(i), change(connector, None, "r", None, customer(i, f"{i}@x"),
                                           snapshot=mark))
                           for i, mark in ((1001, "first"), (1002, "last"))])
    wanted = []
    for begin, ids, changes in transactions:
        produce(kafka, meta, [(None, marker("BEGIN", begin))])
        records: list[tuple[bytes, bytes | None]] = []
        for order, (uid, (i, op, before, after)) in enumerate(zip(ids, changes, strict=True)):
            records.append((None if i is None else key(i),
                            change(connector, uid, op, before, after, order + 1)))
            if op == "d":  # Debezium's tombstone, tombstones.on.delete=true
                records.append((key(i), None))
        produce(kafka, topic, records)
        end = ids[-1].rsplit(":", 1)[0] + ":99999999" if connector == "postgresql" else ids[-1]
        produce(kafka, meta, [(None, marker("END", end, len(changes)))])
        wanted.append(begin.split(":")[0] if connector == "postgresql" else begin)
    txs = poll_until(b, lambda ts: len(ts) == 1 + len(transactions), deadline_s=20)
    assert [t.upstream_id for t in txs] == [None, *wanted]
    assert b.stats.bad_records == 0 and b.stats.incomplete_upstream == 0
    assert b.stats.ignored_tombstones == sum(op == "d" for *_, c in transactions for _, op, *_ in c)
    final = {dict(r)["id"]: dict(r) for r in integrate(txs, "customers")}
    assert {i: (r["email"], r["notes"], r["photo"]) for i, r in final.items()} == {
        1001: ("1001@new", NOTES, PHOTO), 1002: ("1002@new", NOTES, PHOTO)}


def test_postgresql_2x_ids_tombstones_and_toast_placeholders(
        kafka: KafkaEndpoint, topic_name: str, dlq: str,
        builders: list[TransactionBuilder]) -> None:
    """Ids as issue 29's Debezium 2.7 stream has them (BEGIN `780:34131152`, change
    `780:34131368`, END `780:34131464`): updates leaving the TOASTed columns alone, an insert
    deleted again, its tombstone; a truncate (no message key, counted by its END event) and
    the rows inserted again in its transaction (`skipped.operations=none`)."""
    c1002, c1005 = customer(1002, "1002@x"), customer(1005, "a")
    final = [customer(i, f"{i}@new") for i in (1001, 1002)]
    run(kafka, topic_name, "postgresql", dlq, builders, [
        ("780:34131152", ["780:34131368"],
         [(1001, "u", None, customer(1001, "1001@new", **TOAST))]),
        ("781:34132000", ["781:34132104", "781:34132208", "781:34132312"],
         [(1005, "c", None, c1005), (1002, "u", c1002, customer(1002, "1002@new", **TOAST)),
          (1006, "c", None, customer(1006, "b"))]),  # left for the truncate to delete
        ("782:34133000", ["782:34133104"], [(1005, "d", c1005, None)]),
        ("783:34134000", ["783:34134104", "783:34134208", "783:34134312"],
         [(None, "t", None, None), (1001, "c", None, final[0]), (1002, "c", None, final[1])]),
    ])


def test_mysql_gtids_and_tombstones(kafka: KafkaEndpoint, topic_name: str, dlq: str,
                                    builders: list[TransactionBuilder]) -> None:
    """GTIDs (mysql.adoc, "Transaction metadata"): the same on BEGIN, the changes and END, and a
    colon that is part of them."""
    gtid = "3E11FA47-71CA-11E1-9E33-C80AA9429562:{}"
    c1005 = customer(1005, "a")
    run(kafka, topic_name, "mysql", dlq, builders, [
        (gtid.format(23), [gtid.format(23)] * 2,
         [(1001, "u", None, customer(1001, "1001@new")), (1005, "c", None, c1005)]),
        (gtid.format(24), [gtid.format(24)],
         [(1002, "u", None, customer(1002, "1002@new"))]),
        (gtid.format(25), [gtid.format(25)], [(1005, "d", c1005, None)]),
    ])


def test_the_flattened_form(kafka: KafkaEndpoint, topic_name: str, dlq: str,
                            builders: list[TransactionBuilder]) -> None:
    """ExtractNewRecordState with `delete.handling.mode=rewrite`, `add.fields=op` and the
    tombstones kept: snapshot reads, then an update leaving the TOASTed columns alone, a
    delete and its tombstone, in mini-batches; nothing dead-lettered."""
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="customers", topic=topic_name, schema=CUSTOMERS,
                      format="debezium_flattened", semantics="upsert")
    builders.append(b := make_builder(kafka, [spec], dlq))
    produce(kafka, topic_name, [(key(i), flat(customer(i, f"{i}@x"), False, "r"))
                                for i in (1001, 1002, 1003)])
    txs = poll_until(b, lambda ts: len(ts) == 1)
    produce(kafka, topic_name, [
        (key(1001), flat(customer(1001, "1001@new", **TOAST), False, "u")),
        (key(1003), flat(old_key_only(1003), True, "d")), (key(1003), None)])
    txs += poll_until(b, lambda ts: len(ts) == 1)
    assert b.stats.bad_records == 0 and b.stats.ignored_tombstones == 1
    final = {dict(r)["id"]: dict(r) for r in integrate(txs, "customers")}
    assert {i: (r["email"], r["notes"], r["photo"]) for i, r in final.items()} == {
        1001: ("1001@new", NOTES, PHOTO), 1002: ("1002@x", NOTES, PHOTO)}
