"""The transaction boundaries' pure core, without a broker: records as arrays in, closed
transactions out. Mini-batches and upstream transactions against row-at-a-time models over
random partition interleavings and poll cuts; replay after a restore; the id-change, end-marker
and Debezium rules; expiry and late records."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.boundary_records import Rec, feed, members, policy

from txstream.schemas.sources import BatchPolicy
from txstream.sources.boundaries import (
    PolledRecords,
    TopicRule,
    TransactionBoundaries,
)
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.transaction_batch import Transaction

PARTITIONS = [("t", 0), ("t", 1), ("t", 2)]
BATCHED = {"t": TopicRule()}
COUNTED = {"t": TopicRule(upstream=True)}


def core_of(pol: BatchPolicy, rules: dict[str, TopicRule] = BATCHED,
            positions: dict[tuple[str, int], int] | None = None) -> TransactionBoundaries:
    core = TransactionBoundaries(pol, rules)
    core.assign(PARTITIONS, positions or {})
    return core


def interleave(queues: list[list[Rec]], draw: st.DataObject) -> list[Rec]:
    """The queues' records merged in a random order that keeps each queue's order."""
    queues = [list(q) for q in queues if q]
    out: list[Rec] = []
    while queues:
        q = queues[draw.draw(st.integers(0, len(queues) - 1))]
        out.append(q.pop(0))
        queues = [q for q in queues if q]
    return out


def cut(records: list[Rec], draw: st.DataObject) -> list[list[Rec]]:
    """`records` as consecutive polls, some of them empty."""
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(records)), max_size=6)))
    bounds = [0, *cuts, len(records)]
    return [records[a:b] for a, b in itertools.pairwise(bounds)]


def safe_pins(position: dict[tuple[str, int], int], pending: Sequence[Rec]
              ) -> dict[str, dict[int, int]]:
    """The model's safe offsets: each partition's position, but never past a record still
    pending (read and not in a transaction emitted so far)."""
    out: dict[str, dict[int, int]] = {}
    for tp, pos in position.items():
        firsts = [r.offset for r in pending if r.partition == tp]
        out.setdefault(tp[0], {})[tp[1]] = min([pos, *firsts])
    return out


# ---- mini-batches -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data(), max_events=st.integers(1, 5),
       sizes=st.lists(st.integers(0, 6), min_size=3, max_size=3))
def test_mini_batches_match_a_row_at_a_time_model(data: st.DataObject, max_events: int,
                                                  sizes: list[int]) -> None:
    """Records cut at `max_events`, at the end of a poll that caught up, and at a poll that
    finds the open batch due; numbered in order, with their offset ranges, and offsets never
    past a record of a batch still open."""
    queues = [[Rec(tp, 10 + i) for i in range(n)] for tp, n in zip(PARTITIONS, sizes,
                                                                    strict=True)]
    stream = interleave(queues, data)
    polls = cut(stream, data)
    flags = [data.draw(st.tuples(st.booleans(), st.booleans())) for _ in polls]
    pol = policy(max_events, True).model_copy(update={"max_delay_ms": 1000})
    core = core_of(pol)
    now = 0.0
    # The model: batches cut as the rule says, each with the positions when it closed.
    position: dict[tuple[str, int], int] = {}
    current: list[Rec] = []
    started = 0.0
    expected: list[tuple[list[Rec], dict[str, dict[int, int]]]] = []
    got: list[Transaction] = []
    for poll, (late, caught) in zip(polls, flags, strict=True):
        now += 2.0 if late else 0.1
        closed_now: list[list[Rec]] = []
        if current and now - started >= 1.0:
            closed_now.append(current)
            current = []
        for r in poll:
            if not current:
                started = now
            current.append(r)
            position[r.partition] = r.offset + 1
            if len(current) == max_events:
                closed_now.append(current)
                current = []
        if current and caught:
            closed_now.append(current)
            current = []
        for i, batch in enumerate(closed_now):
            later = [r for b in closed_now[i + 1:] for r in b] + current
            expected.append((batch, safe_pins(position, later)))
        got += feed(core, poll, now, caught_up=caught).transactions
    assert [t.number for t in got] == list(range(1, len(expected) + 1))
    assert members(got, stream) == [b for b, _ in expected]
    assert [t.offsets for t in got] == [pins for _, pins in expected]
    assert all(t.upstream_id is None for t in got)


def test_a_poll_waits_no_longer_than_the_open_mini_batch_is_due() -> None:
    pol = policy(10).model_copy(update={"max_delay_ms": 500})
    core = core_of(pol)
    assert core.timeout(2.0, now=0.0) == 2.0, "nothing open: the caller's timeout"
    feed(core, [Rec(("t", 0), 0)], now=1.0)
    assert core.timeout(2.0, now=1.2) == pytest.approx(0.3)
    assert core.timeout(2.0, now=9.0) == 0.0
    (t,) = feed(core, [], now=1.5).transactions
    assert t.ranges == {"t": {0: (0, 1)}}


# ---- upstream transactions by expected count ----------------------------------------------


def committed_stream(draw: st.DataObject) -> tuple[list[list[Rec]], dict[str, int]]:
    """Upstream transactions T0, T1... committed in that order, each writing a few records to
    random partitions with its count: per partition, the records in commit order."""
    n = draw.draw(st.integers(1, 5))
    queues: list[list[Rec]] = [[] for _ in PARTITIONS]
    sizes: dict[str, int] = {}
    for k in range(n):
        where = draw.draw(st.lists(st.integers(0, len(PARTITIONS) - 1), min_size=1,
                                   max_size=4))
        sizes[f"T{k}"] = len(where)
        for p in where:
            queues[p].append(Rec(PARTITIONS[p], len(queues[p]), f"T{k}", len(where)))
    return queues, sizes


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_counted_upstream_transactions_close_exactly_once_in_commit_order(
        data: st.DataObject) -> None:
    """However the partitions interleave and the polls cut them, each transaction is emitted
    once, at the poll that reads its last record, after every transaction before it in a
    partition they share, with offsets never past a record of a transaction not yet emitted."""
    queues, sizes = committed_stream(data)
    stream = interleave(queues, data)
    core = core_of(policy(), COUNTED)
    position: dict[tuple[str, int], int] = {}
    read: list[Rec] = []
    emitted: list[Transaction] = []
    for poll in cut(stream, data):
        read += poll
        for r in poll:
            position[r.partition] = r.offset + 1
        closing = feed(core, poll)
        done = {t.upstream_id for t in emitted}
        for t in closing.transactions:
            done.add(t.upstream_id)
            pending = [r for r in read if r.upstream_id not in done]
            assert t.offsets == safe_pins(position, pending)
        emitted += closing.transactions
        seen = {uid: sum(r.upstream_id == uid for r in read) for uid in sizes}
        still_open = [uid for uid, n in sizes.items() if seen[uid] == n and uid not in done]
        # Complete but held back only behind an earlier, incomplete transaction.
        for uid in still_open:
            mine = [r for r in read if r.upstream_id == uid]
            assert any(r.upstream_id not in done and r.upstream_id != uid and
                       r.partition == m.partition and r.offset < m.offset
                       for m in mine for r in stream)
        assert not closing.expired
    assert sorted(t.upstream_id for t in emitted) == sorted(sizes)
    assert [t.number for t in emitted] == list(range(1, len(sizes) + 1))
    order = {t.upstream_id: t.number for t in emitted}
    for queue in queues:
        ids = list(dict.fromkeys(r.upstream_id for r in queue))
        assert [order[i] for i in ids] == sorted(order[i] for i in ids)
    for t, recs in zip(emitted, members(emitted, stream), strict=True):
        assert {r.upstream_id for r in recs} == {t.upstream_id}
        assert len(recs) == sizes[t.upstream_id or ""]


def test_partitions_disagreeing_on_the_commit_order_still_emit_both() -> None:
    """Partition 0 says A then B, partition 1 B then A: each waits for the other, so they go
    in the order they completed."""
    core = core_of(policy(), COUNTED)
    a0, b0 = Rec(("t", 0), 0, "A", 2), Rec(("t", 0), 1, "B", 2)
    b1, a1 = Rec(("t", 1), 0, "B", 2), Rec(("t", 1), 1, "A", 2)
    closing = feed(core, [a0, b0, b1, a1])
    assert [t.upstream_id for t in closing.transactions] == ["B", "A"]


def test_an_incomplete_upstream_transaction_expires_and_stops_holding_others_back() -> None:
    core = core_of(policy(), COUNTED)
    x, g = Rec(("t", 0), 0, "X", 3), Rec(("t", 0), 1, "G", 1)
    assert feed(core, [x, g], now=0.0).transactions == []
    closing = feed(core, [], now=6.0)
    assert [t.key for t in closing.expired] == ["u:X"] and closing.expired[0].seen == 1
    assert [(t.number, t.upstream_id) for t in closing.transactions] == [(1, "G")]
    assert closing.transactions[0].offsets == {"t": {0: 2}}
    assert core.counts.incomplete_upstream == 1


# ---- the other rules ------------------------------------------------------------------------


def test_id_change_closes_a_transaction_once_every_partition_it_used_moved_on() -> None:
    core = core_of(policy(), {"t": TopicRule(upstream=True)})
    p0, p1 = ("t", 0), ("t", 1)
    first = feed(core, [Rec(p0, 0, "7"), Rec(p0, 1, "8"), Rec(p1, 0, "7")])
    assert first.transactions == [], "partition 1 has not moved on from 7"
    second = feed(core, [Rec(p1, 1, "8")])
    assert [t.upstream_id for t in second.transactions] == ["7"]
    third = feed(core, [], ends={p0: 0, p1: 0})
    assert [t.upstream_id for t in third.transactions] == ["8"], "both partitions at the end"


def test_an_end_marker_closes_and_a_record_read_after_is_late() -> None:
    core = core_of(policy(), {"t": TopicRule(upstream=True, awaits_end=True)})
    p0 = ("t", 0)
    closing = feed(core, [Rec(p0, 0, "A"), Rec(p0, 1, "A", end=True), Rec(p0, 2, "B")])
    assert [(t.number, t.upstream_id) for t in closing.transactions] == [(1, "A")]
    topics = np.array(["t"], dtype=object)
    core.consumed(topics, np.array([0]), np.array([3]), {}, 0.0)
    placed = core.place(PolledRecords.of(["t"], [0], [3], ["A"]), core.take_seqs(1), 0.0)
    assert [(x.index, x.upstream_id, x.number) for x in placed.late] == [(0, "A", 1)]
    assert placed.keys.to_pylist() == [None]
    assert core.counts.late_upstream_records == 1


def test_debezium_end_events_set_the_count_and_snapshot_reads_form_mini_batches() -> None:
    rules = {"t": TopicRule(upstream=True, awaits_end=True, ids_optional=True)}
    core = core_of(policy(2), rules)
    p0, p1 = ("t", 0), ("t", 1)
    snapshot = feed(core, [Rec(p0, 0), Rec(p0, 1)])
    assert [t.upstream_id for t in snapshot.transactions] == [None]
    assert feed(core, [Rec(p0, 2, "tx1"), Rec(p1, 0, "tx1")]).transactions == []
    core.announce("tx1", 2, ("meta", 0), 5, core.take_seqs(1), 0.0)
    (t,) = feed(core, []).transactions
    assert (t.number, t.upstream_id) == (2, "tx1")
    assert t.ranges == {"t": {0: (2, 3), 1: (0, 1)}, "meta": {0: (5, 6)}}
    core.announce("tx1", 2, ("meta", 0), 6, core.take_seqs(1), 0.0)  # again: changes nothing
    assert feed(core, []).transactions == []


def test_mini_batches_and_upstream_transactions_share_one_numbering() -> None:
    rules = {"t": TopicRule(upstream=True), "events": TopicRule()}
    core = TransactionBoundaries(policy(2), rules)
    core.assign([("t", 0), ("events", 0)], {})
    closing = feed(core, [Rec(("events", 0), 0), Rec(("t", 0), 0, "U", 1),
                          Rec(("events", 0), 1)])
    # Both complete in this poll: the one completed first (U, at the second record) goes first.
    assert [(t.number, t.upstream_id) for t in closing.transactions] == [(1, "U"), (2, None)]


# ---- wall times and ticks -----------------------------------------------------------------


def test_a_transaction_carries_its_records_latest_timestamp_and_ticks_fill_idle_time() -> None:
    core = core_of(policy(caught_up_rule=True))
    (first,) = feed(core, [Rec(("t", 0), 0, timestamp=7_000), Rec(("t", 1), 0, timestamp=5_000)],
                    caught_up=True).transactions
    assert first.wall_time_ms == 7_000
    assert core.tick(7_999) is None, "not before tick_ms after the last wall time"
    tick = core.tick(8_000)
    assert tick is not None
    assert (tick.number, tick.ranges, tick.wall_time_ms) == (2, {}, 8_000)
    assert tick.offsets == first.offsets, "a tick moves no offset"
    assert core.tick(8_500) is None
    (later,) = feed(core, [Rec(("t", 0), 1, timestamp=8_100)], caught_up=True).transactions
    assert (later.number, later.wall_time_ms) == (3, 8_100)
    assert core.tick(9_000) is None, "tick_ms after the latest wall time, a tick's included"
    assert core.tick(9_100) is not None


def test_no_tick_while_a_transaction_is_open_or_ticks_are_off() -> None:
    core = core_of(policy())  # a mini-batch stays open until max_events or its delay
    assert feed(core, [Rec(("t", 0), 0, timestamp=1_000)]).transactions == []
    assert core.tick(60_000) is None, "a tick would be numbered before the open transaction"
    off = core_of(policy(caught_up_rule=True, tick_ms=0))
    feed(off, [Rec(("t", 0), 0, timestamp=1_000)], caught_up=True)
    assert off.tick(60_000) is None


def test_a_logged_tick_is_replayed_with_its_wall_time() -> None:
    first = core_of(policy(caught_up_rule=True))
    (batch,) = feed(first, [Rec(("t", 0), 0, timestamp=1_000)], caught_up=True).transactions
    tick = first.tick(5_000)
    (after,) = feed(first, [Rec(("t", 0), 1, timestamp=6_000)], caught_up=True).transactions
    assert tick is not None
    logged = [t.log_entry() for t in (batch, tick, after)]
    second = TransactionBoundaries(policy(caught_up_rule=True), BATCHED)
    second.restore(1, [], logged, now=0.0)
    second.assign(PARTITIONS, {})
    again = feed(second, [Rec(("t", 0), 0, timestamp=1_000), Rec(("t", 0), 1, timestamp=6_000)],
                 caught_up=True).transactions
    assert [t.log_entry() for t in again] == logged


# ---- restore and replay -------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data(), batched=st.booleans())
def test_a_restore_replays_the_logged_transactions_and_goes_on(data: st.DataObject,
                                                               batched: bool) -> None:
    """Run, commit through a random transaction, restore from that state with the log of the
    later ones, read again from the committed offsets (another interleaving, other polls, for
    mini-batches another size): the logged transactions come back with their numbers and
    records, nothing committed comes back, and every record is in one transaction."""
    if batched:
        sizes = data.draw(st.lists(st.integers(0, 5), min_size=3, max_size=3))
        queues = [[Rec(tp, i) for i in range(n)] for tp, n in zip(PARTITIONS, sizes,
                                                                   strict=True)]
        rules, first_policy = BATCHED, policy(data.draw(st.integers(1, 4)), True)
        second_policy = policy(data.draw(st.integers(1, 4)), True)
    else:
        queues, _ = committed_stream(data)
        rules, first_policy = COUNTED, policy()
        second_policy = policy()
    stream = interleave(queues, data)
    first = core_of(first_policy, rules)
    emitted: list[Transaction] = []
    for poll in cut(stream, data):
        emitted += feed(first, poll, caught_up=True).transactions
    if not emitted:
        return
    upto = data.draw(st.integers(0, len(emitted)))
    if upto:
        first.committed(emitted[upto - 1])
    offsets = first.committed_offsets
    replay = [t.log_entry() for t in emitted[upto:]]
    logged = [t.log_entry() for t in emitted[upto:]]

    second = TransactionBoundaries(second_policy, rules)
    second.restore(upto + 1, first.emitted_ids(), replay, now=0.0)
    positions = {tp: offsets.get(tp[0], {}).get(tp[1], 0) for tp in PARTITIONS}
    second.assign(PARTITIONS, {tp: o for tp, o in positions.items()
                               if tp[0] in offsets and tp[1] in offsets[tp[0]]})
    again = [[r for r in q if r.offset >= positions[r.partition]] for q in queues]
    later = interleave(again, data)
    rebuilt: list[Transaction] = []
    for poll in cut(later, data):
        rebuilt += feed(second, poll, caught_up=True).transactions
    rebuilt += feed(second, [], caught_up=True).transactions
    assert [t.log_entry() for t in rebuilt[:len(logged)]] == logged
    assert [t.number for t in rebuilt] == list(range(upto + 1, upto + 1 + len(rebuilt)))
    done = [r for recs in members(emitted[:upto], stream) for r in recs]
    got = [r for recs in members(rebuilt, stream) for r in recs]
    assert sorted(got, key=repr) == sorted((r for r in stream if r not in done), key=repr)


def test_a_replayed_upstream_transaction_waits_for_its_records() -> None:
    core = TransactionBoundaries(policy(), COUNTED)
    first = core_of(policy(), COUNTED)
    (t,) = feed(first, [Rec(("t", 0), 0, "R", 2), Rec(("t", 0), 1, "R", 2)]).transactions
    core.restore(1, [], [t.log_entry()], now=0.0)
    core.assign(PARTITIONS, {})
    assert feed(core, []).transactions == [], "never emitted empty"
    (again,) = feed(core, [Rec(("t", 0), 0, "R", 2), Rec(("t", 0), 1, "R", 2)]).transactions
    assert again.log_entry() == t.log_entry()


def test_restore_checks_the_numbering_and_that_nothing_was_read() -> None:
    core = core_of(policy(), COUNTED)
    (t,) = feed(core, [Rec(("t", 0), 0, "R", 1)]).transactions
    fresh = TransactionBoundaries(policy(), COUNTED)
    with pytest.raises(KafkaSourceError, match="do not continue"):
        fresh.restore(3, [], [t.log_entry()], now=0.0)
    with pytest.raises(KafkaSourceError, match="before the first poll"):
        core.restore(1, [], [], now=0.0)


def test_records_of_transactions_committed_before_a_restore_are_skipped() -> None:
    core = TransactionBoundaries(policy(), COUNTED)
    core.restore(3, ["B"], [], now=0.0)
    core.assign(PARTITIONS, {("t", 0): 2})
    closing = feed(core, [Rec(("t", 0), 2, "A", 2), Rec(("t", 0), 3, "B", 2),
                          Rec(("t", 0), 4, "A", 2)])
    assert [(t.number, t.upstream_id) for t in closing.transactions] == [(3, "A")]
    assert core.counts.replayed_skipped == 1 and core.counts.late_upstream_records == 0


def test_the_pure_parts_of_the_input_import_no_kafka_client() -> None:
    """The boundaries, the decoder and the pending changes run without confluent_kafka."""
    pure = ["boundaries", "open_transactions", "positions", "decoder", "json_values",
            "field_checks", "single_records", "kafka_source", "pending", "upsert",
            "debezium.metadata", "transaction_batch", "source_checks", "source_state"]
    code = ("import sys\n" + "".join(f"import txstream.sources.{m}\n" for m in pure)
            + "assert 'confluent_kafka' not in sys.modules, 'confluent_kafka imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
