"""Debezium transaction metadata as transaction boundaries, against the broker fixture: change
events of three tables over several partitions, and the `END` events of Debezium's
`<prefix>.transaction` topic that say how many changes each table holds."""

from __future__ import annotations

import json
import random
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import Producer
from support.kafka_helpers import (
    FAST,
    ORDERS,
    integrate,
    make_builder,
    poll_once,
    poll_until,
    produce,
    read_dead_letters,
    rows,
)
from support.service_process import ROOT, ServiceProcess

from txstream.examples import orders as example
from txstream.examples.order_events import Event, OrderWorld, encode, events
from txstream.schemas.sources import RecordField, SourceSpec, UpstreamTransactions
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.embedded.postgres import free_port
from txstream.sources.transactions import TransactionBuilder

TABLES = {"customers": "public.customers", "orders": "public.orders", "items": "public.items"}


def row(i: int) -> dict[str, Any]:
    return {"id": i, "item": f"i{i}", "qty": i}


def change(i: int, txid: str | None, order: int = 1, op: str = "c") -> tuple[str, dict]:
    """A Debezium change event of row `i` (created, or read by a snapshot: no transaction)."""
    tx = None if txid is None else {"id": txid, "total_order": order,
                                    "data_collection_order": order}
    return (f'{{"id": {i}}}', {"before": None, "after": row(i), "op": op,
                               "source": {"connector": "postgresql"}, "transaction": tx})


def begin(txid: str) -> tuple[str, dict]:
    return (f'{{"id": "{txid}"}}', {"status": "BEGIN", "id": txid, "event_count": None,
                                    "data_collections": None})


def end(txid: str, counts: dict[str, int], wrapped: bool = False) -> tuple[str, dict]:
    event = {"status": "END", "id": txid, "event_count": sum(counts.values()),
             "data_collections": [{"data_collection": c, "event_count": n}
                                  for c, n in counts.items()]}
    return (f'{{"id": "{txid}"}}', {"schema": {}, "payload": event} if wrapped else event)


def sources(prefix: str) -> list[SourceSpec]:
    return [SourceSpec(name=name, topic=f"{prefix}.{name}", schema=ORDERS, format="debezium",
                       semantics="insert_delete",
                       upstream=UpstreamTransactions(metadata_topic=f"{prefix}.transaction",
                                                     data_collection=collection))
            for name, collection in TABLES.items()]


def create_topics(kafka: KafkaEndpoint, prefix: str) -> None:
    kafka.create_topic(f"{prefix}.customers", 2)
    kafka.create_topic(f"{prefix}.orders", 2)
    kafka.create_topic(f"{prefix}.items", 1)
    kafka.create_topic(f"{prefix}.transaction", 1)


def test_a_transaction_spanning_three_tables_closes_once_its_end_event_is_matched(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    """Changes of two transactions interleaved over five partitions of three topics, read in
    any order: each closes exactly when every change its END event announces for the
    pipeline's tables was read, and they are emitted in commit order (the END events')."""
    create_topics(kafka, topic_name)
    builders.append(b := make_builder(kafka, sources(topic_name)))
    meta = f"{topic_name}.transaction"
    # A snapshot read carries no transaction: a mini-batch.
    produce(kafka, f"{topic_name}.customers", [change(1, None, op="r")])
    (snapshot,) = poll_until(b, lambda ts: len(ts) == 1)
    assert (snapshot.number, snapshot.upstream_id) == (1, None)

    produce(kafka, meta, [begin("tx1"), begin("tx2")])
    produce(kafka, f"{topic_name}.customers", [change(10, "tx1", 1)], partition=0)
    produce(kafka, f"{topic_name}.orders", [change(20, "tx2", 1)], partition=0)
    produce(kafka, f"{topic_name}.orders", [change(21, "tx1", 3)], partition=1)
    produce(kafka, f"{topic_name}.items", [change(31, "tx1", 4), change(30, "tx2", 2)])
    # tx1 commits first; it changed an audit table the pipeline does not read.
    produce(kafka, meta, [
        end("tx1", {"public.customers": 2, "public.orders": 1, "public.items": 1,
                    "public.audit": 5}),
        end("tx2", {"public.orders": 1, "public.items": 1}, wrapped=True),
    ])
    # tx2 is complete but commits after tx1, whose change in the second customers partition
    # is read last (as when that partition is fetched late).
    for _ in range(5):
        assert poll_once(b, 0.2) == []
    produce(kafka, f"{topic_name}.customers", [change(11, "tx1", 2)], partition=1)
    txs = poll_until(b, lambda ts: len(ts) == 2)
    assert [(t.number, t.upstream_id) for t in txs] == [(2, "tx1"), (3, "tx2")]
    assert [r["id"] for r in rows(txs[0], "customers")] == [10, 11]
    assert [r["id"] for r in rows(txs[0], "orders")] == [21]
    assert [r["id"] for r in rows(txs[0], "items")] == [31]
    assert [r["id"] for r in rows(txs[1], "orders")] == [20]
    assert [r["id"] for r in rows(txs[1], "items")] == [30]
    assert txs[1].changes["customers"].num_rows == 0
    # The END events are part of their transactions' offset ranges (re-read on a restart).
    assert txs[0].ranges[meta] == {0: (2, 3)} and txs[1].ranges[meta] == {0: (3, 4)}
    assert txs[1].offsets[meta] == {0: 4}


def test_a_missing_change_dead_letters_its_transaction_after_the_timeout(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder]
) -> None:
    """The END event announces two orders changes, one never arrives: at the timeout the
    transaction's records go to the dead-letter topic, and the transaction after it, held back
    until then (it committed later), is emitted. A metadata record that is not a Debezium
    transaction event is dead-lettered too, and changes nothing."""
    create_topics(kafka, topic_name)
    policy = FAST.model_copy(update={"upstream_timeout_ms": 800})
    builders.append(b := make_builder(kafka, sources(topic_name), dlq, policy))
    meta = f"{topic_name}.transaction"
    produce(kafka, f"{topic_name}.orders", [change(1, "lost", 1), change(2, "ok", 1)])
    produce(kafka, meta, [("x", {"not": "a transaction event"}),
                          end("lost", {"public.orders": 2}), end("ok", {"public.orders": 1})])
    (t,) = poll_until(b, lambda ts: len(ts) == 1, deadline_s=15)
    assert (t.number, t.upstream_id) == (1, "ok") and integrate([t], "orders") == {
        (("id", 2), ("item", "i2"), ("qty", 2)): 1}
    assert b.stats.incomplete_upstream == 1 and b.stats.bad_records == 1
    b.commit(t)
    letters = read_dead_letters(kafka, dlq, 2)
    lost, metadata = sorted(letters, key=lambda letter: "lost" not in letter["txstream.error"])
    assert "1 record(s) read of 2 announced" in lost["txstream.error"]
    assert lost["txstream.topic"] == f"{topic_name}.orders"
    # The original record, byte for byte: replayable.
    assert (lost["key"], lost["value"]) == (b'{"id": 1}',
                                            json.dumps(change(1, "lost", 1)[1]).encode())
    assert "without status BEGIN or END" in metadata["txstream.error"]
    assert metadata["txstream.topic"] == meta


def test_a_restart_rebuilds_an_uncommitted_transaction_from_its_changes_and_end_event(
    kafka: KafkaEndpoint, topic_name: str, tmp_path: Path
) -> None:
    """tx1 and tx2 are emitted, only tx1 is committed, then the builder stops (a crash). The
    next one, restored from tx1's state with tx2's log entry, rebuilds tx2 with its number
    from the same records (its END event included), and numbers tx3 after it."""
    create_topics(kafka, topic_name)
    meta = f"{topic_name}.transaction"
    group = uuid.uuid4().hex
    produce(kafka, f"{topic_name}.orders", [change(1, "tx1"), change(2, "tx2")])
    produce(kafka, f"{topic_name}.customers", [change(3, "tx2", 2)])
    produce(kafka, meta, [end("tx1", {"public.orders": 1}),
                          end("tx2", {"public.orders": 1, "public.customers": 1})])
    first = TransactionBuilder(kafka.bootstrap_servers, sources(topic_name), group_id=group,
                               policy=FAST)
    try:
        before = poll_until(first, lambda ts: len(ts) == 2)
        assert [(t.number, t.upstream_id) for t in before] == [(1, "tx1"), (2, "tx2")]
        first.commit(before[0])
        state = first.state()
        assert state.offsets[meta] == {0: 1}  # tx2's END is read again
    finally:
        first.close()

    second = TransactionBuilder(kafka.bootstrap_servers, sources(topic_name), group_id=group,
                                policy=FAST)
    try:
        second.restore(state, replay=[before[1].log_entry()])
        (again,) = poll_until(second, lambda ts: len(ts) == 1)
        assert (again.number, again.upstream_id) == (2, "tx2")
        for name in TABLES:
            assert rows(again, name) == rows(before[1], name)
        produce(kafka, f"{topic_name}.items", [change(4, "tx3")])
        produce(kafka, meta, [end("tx3", {"public.items": 1})])
        (third,) = poll_until(second, lambda ts: len(ts) == 1)
        assert (third.number, third.upstream_id) == (3, "tx3")
        assert [r["id"] for r in rows(third, "items")] == [4]
    finally:
        second.close()


def test_metadata_settings_are_checked() -> None:
    spec = UpstreamTransactions(metadata_topic="db.transaction", data_collection="public.t")
    assert spec.id == RecordField(field="transaction.id") and spec.needs_end
    with pytest.raises(ValueError, match="go together"):
        UpstreamTransactions(metadata_topic="db.transaction")
    with pytest.raises(ValueError, match="not count and metadata_topic"):
        UpstreamTransactions(id=RecordField(field="tx"), count=RecordField(field="n"),
                             metadata_topic="db.transaction", data_collection="public.t")


# ---- end to end: Debezium transactions through the service, killed and restarted ----------


def _debezium_stream(count: int, seed: int) -> tuple[list[list[Event]], OrderWorld]:
    """`count` events of the example, in source transactions of 1 to 6 changes."""
    rng = random.Random(seed)
    stream = events(rng, customers=40)
    transactions: list[list[Event]] = []
    left = count
    while left:
        size = min(left, rng.randint(1, 6))
        transactions.append([next(stream) for _ in range(size)])
        left -= size
    world = OrderWorld()
    for txn in transactions:
        for event in txn:
            world.apply(event)
    return transactions, world


def _net_changes(transactions: list[list[Event]]) -> dict[int, set[tuple[Any, ...]]]:
    """Per source transaction (numbered from 1 in commit order), the changes of the mirrored
    tables it makes, as (table, row..., diff): what its one stream transaction must hold."""
    current: dict[str, dict[int, dict[str, Any]]] = {"customers": {}, "orders": {}}
    out: dict[int, set[tuple[Any, ...]]] = {}
    for number, txn in enumerate(transactions, start=1):
        before = {(s, k): current[s].get(k) for s, k, _ in txn}
        for source, key, row in txn:
            if row is None:
                current[source].pop(key, None)
            else:
                current[source][key] = row
        changes = set()
        for (source, key), old in before.items():
            new = current[source].get(key)
            if old != new:
                changes |= {(source, *r.values(), d) for r, d in ((old, -1), (new, 1)) if r}
        if changes:
            out[number] = changes
    return out


def _produce_debezium(bootstrap: str, prefix: str, transactions: list[list[Event]]) -> None:
    """As Debezium 2.x's PostgreSQL connector writes them: ids `txId:LSN`, the LSN each event's
    own (DBZ-5329), and a tombstone after each delete (`tombstones.on.delete=true`)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    current: dict[tuple[str, int], dict[str, Any]] = {}
    for number, txn in enumerate(transactions, start=1):
        counts: dict[str, int] = {}
        for order, (source, key, row) in enumerate(txn, start=1):
            before = current.get((source, key))
            op = "d" if row is None else ("c" if before is None else "u")
            if row is None:
                current.pop((source, key), None)
            else:
                current[(source, key)] = row
            txid = f"{number + 700}:{34131152 + 1000 * number + 8 * order}"
            value = {"before": before, "after": row, "op": op,
                     "source": {"connector": "postgresql", "table": source},
                     "transaction": {"id": txid, "total_order": order,
                                     "data_collection_order": order}}
            record_key = encode((source, key, row))[0]
            producer.produce(f"{prefix}.{source}", key=record_key,
                             value=json.dumps(value, default=str).encode())
            if op == "d":
                producer.produce(f"{prefix}.{source}", key=record_key, value=None)
            counts[f"public.{source}"] = counts.get(f"public.{source}", 0) + 1
        end_key, end_value = end(f"{number + 700}:{34131152 + 1000 * number + 999}", counts)
        producer.produce(f"{prefix}.transaction", key=end_key.encode(),
                         value=json.dumps(end_value).encode())
    assert producer.flush(60) == 0


def test_source_transactions_through_the_service_exactly_once_across_kill_9(
        kafka, postgres, pg_schema, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Debezium transactions of two tables (orders over three partitions) through `txstream
    run`, killed with SIGKILL after a batch's sinks wrote (offsets not committed) and mid
    write of a batch, then restarted: every source transaction is exactly one stream
    transaction, numbered in commit order, its changes in PostgreSQL once."""
    prefix = topic_name
    kafka.create_topic(f"{prefix}.customers", 1)
    kafka.create_topic(f"{prefix}.orders", 3)
    kafka.create_topic(f"{prefix}.transaction", 1)
    transactions, world = _debezium_stream(1500, seed=3)
    _produce_debezium(kafka.bootstrap_servers, prefix, transactions)
    schemas = {"customers": example.CUSTOMERS, "orders": example.ORDERS}
    group = f"g-{topic_name}"
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "support.mirror_pipeline:pipeline", "consumer_group": group,
        "http_port": free_port(), "checkpoint_dir": str(tmp_path / "ck"),
        "batch_transactions": 60, "checkpoint_every_batches": 2,
        "sources": [{
            "name": name, "topic": f"{prefix}.{name}", "format": "debezium",
            "semantics": "upsert", "decimal_handling_mode": "string",
            "schema": schema.model_dump(mode="json"),
            "upstream": {"metadata_topic": f"{prefix}.transaction",
                         "data_collection": f"public.{name}"}}
            for name, schema in schemas.items()],
        "sinks": [{"output": name, "kind": "postgres_append", "db_schema": pg_schema,
                   "table": f"{name}_changes"} for name in schemas],
    }))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "DATABASE_URL": postgres.url,
           "PYTHONPATH": str(ROOT / "tests")}
    log_path = tmp_path / "run.log"
    for crash in ("commit:2", "sink_write:2"):
        service = ServiceProcess(config, {**env, "TXSTREAM_CRASH_AT": crash}, log_path)
        assert service.wait(timeout=600) == -signal.SIGKILL, service.tail()

    want = _net_changes(transactions)
    columns = {name: ", ".join(schema.names) for name, schema in schemas.items()}

    def appended() -> list[tuple[Any, ...]]:
        with psycopg.connect(postgres.url) as conn:
            return [(name, *r) for name in schemas for r in conn.execute(
                f'SELECT {columns[name]}, time, diff FROM "{pg_schema}"."{name}_changes"')]

    service = ServiceProcess(config, env, log_path)
    service._until("the last source transaction in PostgreSQL",
                   lambda: max((r[-2] for r in appended()), default=0) >= max(want),
                   timeout=600)
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=90) == 0, service.tail()

    rows = appended()
    assert len(rows) == len(set(rows)), "a change appended twice"
    got: dict[int, set[tuple[Any, ...]]] = {}
    for *row, time_, diff in rows:
        got.setdefault(time_, set()).add((*row, diff))
    assert got.keys() == want.keys(), "stream transactions are not the source transactions"
    for number, changes in want.items():
        assert got[number] == changes, f"transaction {number}: {got[number] ^ changes}"
    final = {(s, *r.values()) for s, table in (("customers", world.customers),
                                               ("orders", world.orders)) for r in table.values()}
    integrated: dict[tuple[Any, ...], int] = {}
    for *row, _, diff in rows:
        integrated[tuple(row)] = integrated.get(tuple(row), 0) + diff
    assert {r for r, w in integrated.items() if w} == final
