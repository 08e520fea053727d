"""The transaction builder end to end against the broker fixture: upstream transactions of
Kafka transactional producers (counts, aborts, poison records), several sources with one
numbering, state round trips and replays, the caught-up rule with the client's reports; and,
without a broker, the vectorized upsert against a row-at-a-time model and the consumer's
positions. The rules themselves are tested on the pure core in test_boundaries."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import KafkaError, Producer
from hypothesis import given, settings
from hypothesis import strategies as st
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

from txstream.schemas.sources import RecordField, SourceSpec, UpstreamTransactions
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.sources.consumed import records_and_ends
from txstream.sources.kafka_source import DELETE, SEQ, KafkaSourceError
from txstream.sources.positions import advance, caught_up
from txstream.sources.source_state import SourceState
from txstream.sources.transactions import TransactionBuilder
from txstream.sources.upsert import UpsertState

COUNTED = UpstreamTransactions(id=RecordField(header="txid"), count=RecordField(header="txn"))
BY_ID_CHANGE = UpstreamTransactions(id=RecordField(field="tx"), id_type="bigint")


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "item": f"i{i}", "qty": i, **extra}


def expect(ids: list[int]) -> dict[tuple, int]:
    return {(("id", i), ("item", f"i{i}"), ("qty", i)): 1 for i in ids}


class UpstreamProducer:
    """A Kafka transactional producer writing records tagged with an upstream id and count."""

    def __init__(self, kafka: KafkaEndpoint, topic: str, txid: str, count: int) -> None:
        self.topic, self.txid, self.count = topic, txid, count
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap_servers,
                                  "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
        self.producer.init_transactions(10)
        self.producer.begin_transaction()

    def send(self, i: int, partition: int, value: bytes | None = None) -> None:
        self.producer.produce(
            self.topic, key=str(i).encode(), partition=partition,
            value=value if value is not None else _json(i),
            headers=[("txid", self.txid.encode()), ("txn", str(self.count).encode())],
        )

    def commit(self) -> None:
        self.producer.commit_transaction(10)

    def abort(self) -> None:
        self.producer.flush(10)
        self.producer.abort_transaction(10)


def _json(i: int) -> bytes:
    return f'{{"id": {i}, "item": "i{i}", "qty": {i}}}'.encode()


def counted_source(topic: str) -> SourceSpec:
    return SourceSpec(name="orders", topic=topic, schema=ORDERS, upstream=COUNTED)


def test_interleaved_upstream_transactions_over_three_partitions(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    kafka.create_topic(topic_name, 3)
    builders.append(b := make_builder(kafka, [counted_source(topic_name)]))
    big = UpstreamProducer(kafka, topic_name, "A", 6)
    small = UpstreamProducer(kafka, topic_name, "B", 2)
    # A spans partitions 0, 1, 2; B's records sit between A's in partitions 0 and 2.
    big.send(1, 0)
    small.send(10, 0)
    big.send(2, 1)
    big.send(3, 2)
    small.send(11, 2)
    big.send(4, 0)
    big.send(5, 1)
    small.commit()
    big.send(6, 2)
    big.commit()
    txs = poll_until(b, lambda ts: len(ts) == 2)
    by_id = {t.upstream_id: t for t in txs}
    assert sorted(by_id) == ["A", "B"] and sorted(t.number for t in txs) == [1, 2]
    assert integrate([by_id["A"]], "orders") == expect([1, 2, 3, 4, 5, 6])
    assert integrate([by_id["B"]], "orders") == expect([10, 11])
    assert set(by_id["A"].ranges[topic_name]) == {0, 1, 2}
    assert set(by_id["B"].ranges[topic_name]) == {0, 2}
    # Offsets never pass a record of a transaction still open when this one closed.
    first, second = sorted(txs, key=lambda t: t.number)
    for partition, (start, _) in second.ranges[topic_name].items():
        assert first.offsets[topic_name][partition] <= start


def test_aborted_partial_upstream_transaction_never_appears(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder]
) -> None:
    """Two of three announced records, then an abort. Apache Kafka hides them from
    read_committed consumers; the mock broker delivers them, and the count rule keeps the
    transaction open until the timeout sends its records to the dead-letter topic."""
    kafka.create_topic(topic_name, 2)
    policy = FAST.model_copy(update={"upstream_timeout_ms": 800})
    builders.append(b := make_builder(kafka, [counted_source(topic_name)], dlq, policy))
    aborted = UpstreamProducer(kafka, topic_name, "X", 3)
    aborted.send(100, 0)
    aborted.send(101, 1)
    aborted.abort()
    good = UpstreamProducer(kafka, topic_name, "G", 2)
    good.send(1, 0)
    good.send(2, 1)
    good.commit()
    txs = poll_until(b, lambda ts: len(ts) == 1)
    assert txs[0].upstream_id == "G" and integrate(txs, "orders") == expect([1, 2])
    # Later polls never emit X, whatever the broker delivered.
    for _ in range(6):
        txs += poll_once(b, 0.2)
    assert [t.upstream_id for t in txs] == ["G"]
    if isinstance(kafka, MockKafkaBroker):
        assert b.stats.incomplete_upstream == 1
        b.commit(txs[0])
        letters = read_dead_letters(kafka, dlq, 2)
        assert len(letters) == 2 and all("incomplete" in x["txstream.error"] for x in letters)


def test_aborted_complete_upstream_transaction_never_appears(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    if isinstance(kafka, MockKafkaBroker):
        pytest.skip("librdkafka's mock broker delivers aborted transactional records to "
                    "read_committed consumers; a fully written aborted transaction can only be "
                    "hidden by a real broker (set KAFKA_BOOTSTRAP_SERVERS)")
    kafka.create_topic(topic_name, 2)
    builders.append(b := make_builder(kafka, [counted_source(topic_name)]))
    aborted = UpstreamProducer(kafka, topic_name, "X", 2)
    aborted.send(100, 0)
    aborted.send(101, 1)
    aborted.abort()
    good = UpstreamProducer(kafka, topic_name, "G", 1)
    good.send(1, 1)
    good.commit()
    txs = poll_until(b, lambda ts: len(ts) == 1)
    for _ in range(5):
        txs += poll_once(b, 0.2)
    assert [t.upstream_id for t in txs] == ["G"] and integrate(txs, "orders") == expect([1])


def test_poison_record_does_not_hold_back_or_drop_its_transaction(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder]
) -> None:
    kafka.create_topic(topic_name, 1)
    builders.append(b := make_builder(kafka, [counted_source(topic_name)], dlq))
    txn = UpstreamProducer(kafka, topic_name, "P", 3)
    txn.send(1, 0)
    txn.send(2, 0, value=b'{"id": 2, "item": ')
    txn.send(3, 0)
    txn.commit()
    (t,) = poll_until(b, lambda ts: len(ts) == 1)
    assert t.upstream_id == "P" and integrate([t], "orders") == expect([1, 3])
    assert b.stats.bad_records == 1


def test_sources_share_one_numbering_and_one_upstream_transaction_spans_topics(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    other = f"{topic_name}-b"
    kafka.create_topic(topic_name, 1)
    kafka.create_topic(other, 1)
    a = counted_source(topic_name)
    c = SourceSpec(name="customers", topic=other, schema=ORDERS, semantics="upsert",
                   upstream=COUNTED)
    builders.append(b := make_builder(kafka, [a, c]))
    first = UpstreamProducer(kafka, topic_name, "T1", 3)
    first.send(1, 0)
    first.topic = other
    first.send(50, 0)
    first.send(51, 0)
    first.commit()
    second = UpstreamProducer(kafka, other, "T2", 1)
    second.send(50, 0, value=_json(50).replace(b'"qty": 50', b'"qty": 0'))
    second.commit()
    txs = poll_until(b, lambda ts: len(ts) == 2)
    assert [(t.number, t.upstream_id) for t in txs] == [(1, "T1"), (2, "T2")]
    assert integrate(txs[:1], "orders") == expect([1])
    assert integrate(txs[:1], "customers") == expect([50, 51])
    assert rows(txs[1], "customers") == [
        {"id": 50, "item": "i50", "qty": 0, "time": 2, "diff": 1},
        {"id": 50, "item": "i50", "qty": 50, "time": 2, "diff": -1},
    ]
    assert txs[1].changes["orders"].num_rows == 0


# ---- restart ------------------------------------------------------------------------------


def test_state_round_trip_keeps_numbers_upsert_rows_and_emitted_transactions(
    kafka: KafkaEndpoint, topic_name: str, tmp_path: Path
) -> None:
    """Partition order S1 B1 A1 B2: B closes while A is open, so the saved offsets point at A1,
    before B2. After the restore B is not emitted again (B2 is skipped), A gets the next
    number, and its upsert sees the rows of the checkpoint."""
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert",
                      upstream=COUNTED)

    def tagged(i: int, txid: str, count: int, qty: int | None = None) -> Any:
        headers = [("txid", txid.encode()), ("txn", str(count).encode())]
        return (str(i), order(i, qty=i if qty is None else qty), headers)

    group = uuid.uuid4().hex
    first = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group, policy=FAST)
    try:
        produce(kafka, topic_name, [tagged(1, "S", 1), tagged(2, "B", 2),
                                    tagged(1, "A", 2, qty=9), tagged(4, "B", 2)])
        txs = poll_until(first, lambda ts: len(ts) == 2)
        assert [(t.number, t.upstream_id) for t in txs] == [(1, "S"), (2, "B")]
        first.commit(txs[-1])
        assert txs[-1].offsets == {topic_name: {0: 2}}  # A1: A is still open
        state = first.state()
        assert state.emitted_upstream_ids == ["B"] and state.next_number == 3
        state.save(tmp_path / "ckpt")
    finally:
        first.close()

    second = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group, policy=FAST)
    try:
        second.restore(SourceState.load(tmp_path / "ckpt"))
        produce(kafka, topic_name, [tagged(3, "A", 2)])
        (t,) = poll_until(second, lambda ts: len(ts) == 1)
        assert (t.number, t.upstream_id) == (3, "A")
        assert rows(t) == [
            {"id": 1, "item": "i1", "qty": 1, "time": 3, "diff": -1},
            {"id": 1, "item": "i1", "qty": 9, "time": 3, "diff": 1},
            {"id": 3, "item": "i3", "qty": 3, "time": 3, "diff": 1},
        ]
        assert second.stats.replayed_skipped == 1 and second.stats.late_upstream_records == 0
    finally:
        second.close()


# ---- the vectorized upsert against a row-at-a-time model ----------------------------------

_events = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 4), st.one_of(st.none(), st.integers(0, 2))),
    max_size=40,
)


# The same key space with a two-column key (text, bigint): key k is ("r<k % 2>", k // 2).
COMPOSITE = TableSchema.of({"id": "bigint", "item": "text", "qty": "int"},
                           primary_key=["item", "id"])


@settings(max_examples=80, deadline=None)
@given(initial=st.dictionaries(st.integers(0, 4), st.integers(0, 2), max_size=4), events=_events,
       compact_min=st.sampled_from([1, 3, 1000]), composite=st.booleans())
def test_upsert_matches_model(initial: dict[int, int], events: list[tuple[int, int, int | None]],
                              compact_min: int, composite: bool) -> None:
    """Events are (transaction, key, qty or None for a delete); several transactions per call,
    and the rows before the last call recovered from its changes. Small `compact_min` values
    compact the current rows on (almost) every call."""
    schema = COMPOSITE if composite else ORDERS

    def row(k: int, qty: int | None) -> dict[str, Any]:
        if composite:
            return {"id": k // 2, "item": f"r{k % 2}", "qty": qty}
        return {"id": k, "item": None if qty is None else "x", "qty": qty}

    def key(r: dict[str, Any]) -> int:
        return r["id"] * 2 + int(r["item"][1]) if composite else r["id"]

    current = pa.Table.from_pylist([row(k, v) for k, v in initial.items()],
                                   schema=schema.arrow_schema())
    state = UpsertState(schema, current, compact_min=compact_min)
    records = pa.Table.from_pylist(
        [{**row(k, q), "time": t, SEQ: i, DELETE: q is None}
         for i, (t, k, q) in enumerate(events)],
        schema=pa.schema([*schema.arrow_schema(), pa.field("time", pa.int64()),
                          pa.field(SEQ, pa.int64()), pa.field(DELETE, pa.bool_())]),
    )
    # Two calls (transactions 1-2, then 3), as two polls would make them.
    late = pc.equal(records.column("time"), 3)
    early_changes, early_counts = state.apply(records.filter(pc.invert(late)))
    after_early = state.rows
    late_changes, late_counts = state.apply(records.filter(late))
    changes = pa.concat_tables([early_changes, late_changes])
    assert _sorted(state.rows_before(late_changes)) == _sorted(after_early)

    model = dict(initial)
    expected: list[tuple[int, int, int, int]] = []
    absent = 0
    for t in sorted({e[0] for e in events}):
        last = {k: q for (tt, k, q) in events if tt == t}
        for k, q in sorted(last.items()):
            old = model.get(k)
            if q is None:
                absent += old is None
                if old is not None:
                    expected.append((t, k, old, -1))
                    del model[k]
            elif old != q:
                if old is not None:
                    expected.append((t, k, old, -1))
                expected.append((t, k, q, 1))
                model[k] = q
    got = sorted((r["time"], key(r), r["qty"], r["diff"]) for r in changes.to_pylist())
    assert got == sorted(expected)
    assert early_counts.absent_deletes + late_counts.absent_deletes == absent
    assert sorted((key(r), r["qty"]) for r in state.rows.to_pylist()) == sorted(model.items())


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["id"], r["item"] or ""))


def test_replay_rebuilds_emitted_mini_batches_with_their_numbers(
    kafka: KafkaEndpoint, topic_name: str
) -> None:
    """A crash after T2 reached the sinks but before the checkpoint that covers it: the
    restored builder rebuilds T2 from its logged offset ranges (not from its own, different
    batch size), then numbers new batches after it."""
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    group = uuid.uuid4().hex
    # Record 6 must stay in an open batch when the first builder stops.
    held = FAST.model_copy(update={"max_events": 3, "max_delay_ms": 60_000,
                                   "close_when_caught_up": False})
    first = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group, policy=held)
    try:
        produce(kafka, topic_name, [(None, order(i)) for i in range(3)])
        (t1,) = poll_until(first, lambda ts: len(ts) == 1)
        first.commit(t1)
        checkpoint = first.state()
        produce(kafka, topic_name, [(None, order(i)) for i in range(3, 7)])
        (t2,) = poll_until(first, lambda ts: len(ts) == 1)
        assert t2.number == 2 and integrate([t2], "orders") == expect([3, 4, 5])
    finally:
        first.close()

    second = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group,
                                policy=FAST.model_copy(update={"max_events": 2}))
    try:
        with pytest.raises(KafkaSourceError, match="do not continue"):
            second.restore(checkpoint, replay=[t2.log_entry().model_copy(update={"number": 5})])
        second.restore(checkpoint, replay=[t2.log_entry()])
        again, t3 = poll_until(second, lambda ts: len(ts) == 2)
        assert again.number == 2 and integrate([again], "orders") == integrate([t2], "orders")
        assert again.ranges == t2.ranges
        assert t3.number == 3 and integrate([t3], "orders") == expect([6])
    finally:
        second.close()


def test_a_mini_batch_closes_when_the_consumer_has_caught_up(
    kafka: KafkaEndpoint, topic_name: str
) -> None:
    """A backlog is cut at `max_events`; its remainder, and then a lone record, close as soon
    as every partition is read to its end (the client's reports), not `max_delay_ms` later.
    (Without the rule they wait for the delay: see the mini-batch model in test_boundaries.)"""
    kafka.create_topic(topic_name, 2)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    policy = FAST.model_copy(update={"max_events": 4, "max_delay_ms": 60_000,
                                     "close_when_caught_up": True})
    # Written before the builder starts, so that its first fetch sees the whole backlog.
    produce(kafka, topic_name, [(None, order(i)) for i in range(10)])
    builder = make_builder(kafka, [spec], policy=policy)
    try:
        backlog = poll_until(builder, lambda ts: sum(len(rows(t)) for t in ts) == 10, 5)
        assert [len(rows(t)) for t in backlog] == [4, 4, 2]
        produce(kafka, topic_name, [(None, order(10))], partition=1)
        (lone,) = poll_until(builder, lambda ts: len(ts) == 1, 5)
        assert lone.number == 4 and rows(lone) == [order(10) | {"time": 4, "diff": 1}]
    finally:
        builder.close()


def test_a_transactional_producers_lone_record_closes_its_batch_at_the_end_report(
    kafka: KafkaEndpoint, topic_name: str, builders: list[TransactionBuilder]
) -> None:
    """The commit marker after the record keeps the partition's watermark past it, so the
    client's end-of-partition report closes the batch, long before `max_delay_ms`."""
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    policy = FAST.model_copy(update={"max_delay_ms": 60_000})
    builders.append(b := make_builder(kafka, [spec], policy=policy))
    writer = UpstreamProducer(kafka, topic_name, "t1", 1)
    writer.send(1, partition=0)
    writer.commit()
    (t,) = poll_until(b, lambda ts: len(ts) == 1, 10)
    assert rows(t) == [order(1) | {"time": 1, "diff": 1}]


def test_caught_up_by_the_end_report_or_the_cached_watermark() -> None:
    a, b = ("t", 0), ("t", 1)
    watermarks = {a: 7, b: -1001}  # -1001: the client holds none for b yet
    high = watermarks.__getitem__
    assert caught_up([a, b], {b}, {a: 7}, high), "a read up to its watermark, b reported"
    assert not caught_up([a, b], {b}, {a: 6}, high), "a record of a not read yet"
    assert not caught_up([a, b], set(), {a: 7, b: 3}, high), "nothing known of b's end"
    assert caught_up([a], {a}, {}, high), "reported at its end before any record"
    assert not caught_up([a], set(), {}, {a: 0}.__getitem__), "empty, but no position known"
    assert caught_up([], set(), {}, high)


def test_state_is_taken_through_the_last_committed_transaction(
    kafka: KafkaEndpoint, topic_name: str
) -> None:
    """Polled T2 and T3 are not committed: the state rolls their upserts back, and a builder
    restored from it rebuilds T2 and T3 with the same numbers and changes."""
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert")
    group = uuid.uuid4().hex
    policy = FAST.model_copy(update={"max_events": 2})
    first = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group, policy=policy)
    try:
        produce(kafka, topic_name, [
            ("1", order(1)), ("2", order(2)),  # T1
            ("1", order(1, qty=10)), ("3", order(3)),  # T2
            ('{"id": 2}', None), ("1", order(1, qty=11)),  # T3
        ])
        txs = poll_until(first, lambda ts: len(ts) == 3)
        first.commit(txs[0])
        state = first.state()
    finally:
        first.close()
    assert state.next_number == 2 and state.offsets == {topic_name: {0: 2}}
    assert sorted(state.upsert_rows["orders"].to_pylist(), key=lambda r: r["id"]) == [
        order(1), order(2)
    ]
    second = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=group, policy=policy)
    try:
        second.restore(state)
        again = poll_until(second, lambda ts: len(ts) == 2)
    finally:
        second.close()
    assert [(t.number, rows(t)) for t in again] == [(t.number, rows(t)) for t in txs[1:]]


def test_end_marker_closes_upstream_transactions_and_late_records_are_dead_lettered(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder]
) -> None:
    kafka.create_topic(topic_name, 1)
    marked = UpstreamTransactions(id=RecordField(header="txid"), end=RecordField(field="last"))
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, upstream=marked)
    builders.append(b := make_builder(kafka, [spec], dlq))

    def tagged(i: int, txid: str, **extra: Any) -> Any:
        return (None, order(i, **extra), [("txid", txid.encode())])

    produce(kafka, topic_name, [tagged(1, "A"), tagged(2, "A"), tagged(3, "A", last=True),
                                tagged(4, "B")])
    (a,) = poll_until(b, lambda ts: len(ts) == 1)
    assert a.upstream_id == "A" and integrate([a], "orders") == expect([1, 2, 3])
    produce(kafka, topic_name, [tagged(5, "A"), tagged(6, "B", last=True)])
    (b_txn,) = poll_until(b, lambda ts: len(ts) == 1)
    assert b_txn.upstream_id == "B" and integrate([b_txn], "orders") == expect([4, 6])
    assert b.stats.late_upstream_records == 1
    b.commit(b_txn)
    (letter,) = read_dead_letters(kafka, dlq, 1)
    assert "after the transaction was emitted as #1" in letter["txstream.error"]
    assert letter["value"] == _json(5)


class _Consumed:
    """What `Consumer.consume` returns, as far as `records_and_ends` reads it: a record, or an
    end-of-partition report."""

    def __init__(self, tp: tuple[str, int], offset: int, end: bool) -> None:
        self._tp, self._offset = tp, offset
        self._error = KafkaError(KafkaError._PARTITION_EOF) if end else None

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._offset


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([("a", 0), ("a", 1), ("b", 0)]), st.booleans()),
                max_size=30),
       st.sets(st.sampled_from([("a", 0), ("a", 1), ("b", 0)])))
def test_positions_and_partition_ends_follow_stream_order(
        stream: list[tuple[tuple[str, int], bool]], at_end_before: set[tuple[str, int]]) -> None:
    """A consumed batch (records and end-of-partition reports, interleaved) split by
    `records_and_ends`, then `advance`, ends where handling them one at a time, in order,
    does."""
    want_positions: dict[tuple[str, int], int] = {}
    want_end = set(at_end_before)
    consumed = []
    next_offset: dict[tuple[str, int], int] = {}
    for tp, is_record in stream:
        if is_record:
            offset = next_offset[tp] = next_offset.get(tp, 10) + 1
            want_positions[tp] = offset + 1
            want_end.discard(tp)
        else:
            offset = next_offset.get(tp, 10) + 1
            want_end.add(tp)
        consumed.append(_Consumed(tp, offset, end=not is_record))
    records, ends = records_and_ends(consumed)  # type: ignore[arg-type]
    assert records == [c for c in consumed if c.error() is None]
    positions: dict[tuple[str, int], int] = {}
    at_end = set(at_end_before)
    advance(positions, at_end, np.array([r.topic() for r in records], dtype=object),
            np.array([r.partition() for r in records], dtype=np.int64),
            np.array([r.offset() for r in records], dtype=np.int64), ends)
    assert positions == want_positions
    assert at_end == want_end
