"""Snapshot then streaming, in the transaction boundaries' pure core: Debezium's snapshot reads
(`op: r`, `source.snapshot` first/true/last) carry no transaction and form mini-batches; the
streamed transactions after them carry ids and close on their END events. What docs/guide.md's
Debezium section promises about the first streamed transaction, and where it stops."""

from __future__ import annotations

from support.boundary_records import Rec, feed, members, policy

from txstream.sources.boundaries import TopicRule, TransactionBoundaries

CUSTOMERS, ORDERS, META = ("customers", 0), ("orders", 0), ("meta", 0)
# A Debezium source beside its transaction metadata topic.
DEBEZIUM = TopicRule(upstream=True, awaits_end=True, ids_optional=True)


def boundaries() -> TransactionBoundaries:
    core = TransactionBoundaries(policy(max_events=2, caught_up_rule=True),
                                 {"customers": DEBEZIUM, "orders": DEBEZIUM})
    core.assign([CUSTOMERS, ORDERS, META], {})
    return core


def end_event(core: TransactionBoundaries, txid: str, count: int, offset: int) -> None:
    core.announce(txid, count, META, offset, core.take_seqs(1), 0.0)


def test_a_streamed_transaction_sees_the_whole_snapshot_of_the_tables_it_changes() -> None:
    """The customers' snapshot and the transaction's first change are read before the orders'
    snapshot (partitions read out of step): the transaction still waits for every mini-batch
    of a snapshot read before its records in a partition it changes."""
    core = boundaries()
    snapshot = [Rec(CUSTOMERS, 0), Rec(CUSTOMERS, 1), Rec(CUSTOMERS, 2), Rec(ORDERS, 0),
                Rec(ORDERS, 1)]
    streamed = [Rec(CUSTOMERS, 3, "780"), Rec(ORDERS, 2, "780")]
    first = feed(core, [*snapshot[:3], streamed[0]], caught_up=False)
    end_event(core, "780", 2, 0)
    later = feed(core, [*snapshot[3:], streamed[1]], caught_up=True)
    closed = first.transactions + later.transactions
    assert [t.upstream_id for t in closed] == [None, None, None, "780"]
    assert {r for part in members(closed[:3], snapshot) for r in part} == set(snapshot)


def test_a_table_it_does_not_change_may_still_be_in_its_snapshot() -> None:
    """The limit: a transaction that changes only the customers is complete once its END event
    is read, and goes before the orders' snapshot reads the consumer has not read yet (the
    record marked `snapshot: last` among them)."""
    core = boundaries()
    closed = feed(core, [Rec(CUSTOMERS, 0), Rec(CUSTOMERS, 1), Rec(CUSTOMERS, 2, "780")],
                  caught_up=True).transactions
    end_event(core, "780", 1, 0)
    closed += feed(core, [], caught_up=True).transactions
    closed += feed(core, [Rec(ORDERS, 0), Rec(ORDERS, 1)], caught_up=True).transactions
    assert [t.upstream_id for t in closed] == [None, "780", None]
