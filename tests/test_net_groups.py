"""`txstream.service.net_groups`: fresh batches netted as one; a replay cut at the groups its log
names, each group netted again, transactions logged without a group one part, not netted; a
group whose end is yet to come held for the next batch; groups the progress row falls inside,
or whose end the log lacks, not netted; without netting, nothing cut. And the engine's input
for a batch's parts, each netted part at its last transaction."""

from __future__ import annotations

import pyarrow as pa

from txstream.changes import Changes, consolidate
from txstream.service.checkpoint import _LOG
from txstream.service.net_groups import NetGroups, Part, engine_changes
from txstream.sources.transaction_batch import Transaction, TransactionBatch, TransactionLogEntry


def _batch(first: int, last: int) -> TransactionBatch:
    return TransactionBatch.of([Transaction(number=n, offsets={})
                                for n in range(first, last + 1)], {})


def _log(*groups: tuple[int, int]) -> list[TransactionLogEntry]:
    """Entries of transactions logged in `groups` (first, last); a group of one: not netted."""
    return [TransactionLogEntry(number=n, upstream_id=None, ranges={},
                                netted_through=last if last > first else None)
            for first, last in groups for n in range(first, last + 1)]


def _parts(groups: NetGroups, first: int, last: int) -> list[tuple[int, int, bool]]:
    return [(p.batch.first, p.batch.last.number, p.netted)
            for p in groups.parts(_batch(first, last))]


def test_fresh_batches_of_several_transactions_are_netted_when_the_sinks_allow() -> None:
    assert _parts(NetGroups.of(True, [], 0, None), 1, 5) == [(1, 5, True)]
    assert _parts(NetGroups.of(True, [], 0, None), 1, 1) == [(1, 1, False)]
    assert _parts(NetGroups.of(False, [], 0, None), 1, 5) == [(1, 5, False)]


def test_a_replay_nets_the_logged_groups_again_and_holds_an_unfinished_one() -> None:
    groups = NetGroups.of(True, _log((1, 1), (2, 4), (5, 5), (6, 9)), 9, None)
    assert _parts(groups, 1, 3) == [(1, 1, False)], "2..3 held: 4 is in their group"
    assert groups.held is not None and (groups.held.first, groups.held.last.number) == (2, 3)
    assert _parts(groups, 4, 4) == [(2, 4, True)]
    assert _parts(groups, 5, 6) == [(5, 5, False)]
    assert _parts(groups, 7, 7) == [], "6..7 held across batches"
    assert _parts(groups, 8, 12) == [(6, 9, True), (10, 12, True)], "then fresh ones"
    assert groups.held is None


def test_transactions_logged_without_a_group_are_one_part_not_netted() -> None:
    groups = NetGroups.of(True, _log((1, 1), (2, 2), (3, 3)), 3, 2)
    assert _parts(groups, 1, 5) == [(1, 3, False), (4, 5, True)]


def test_without_netting_now_a_replay_is_not_cut() -> None:
    groups = NetGroups.of(False, _log((1, 3), (4, 5)), 5, 3)
    assert _parts(groups, 1, 6) == [(1, 5, False), (6, 6, False)]


def test_a_group_the_progress_row_falls_inside_is_not_netted() -> None:
    """Its netted batch failed an expression and was computed one transaction at a time, the
    ones before the failing transaction committed: netted now, the replay would straddle them."""
    groups = NetGroups.of(True, _log((1, 2), (3, 6), (7, 8)), 8, 4)
    assert _parts(groups, 1, 8) == [(1, 2, True), (3, 6, False), (7, 8, True)]


def test_a_replay_beginning_inside_a_group_nets_its_tail_unless_the_progress_row_cuts_it(
        ) -> None:
    tail = [e for e in _log((1, 6)) if e.number > 3]  # a checkpoint at #3, inside the group
    assert _parts(NetGroups.of(True, tail, 6, 3), 4, 6) == [(4, 6, True)]
    assert _parts(NetGroups.of(True, tail, 6, 4), 4, 6) == [(4, 6, False)]


def test_a_group_whose_end_the_log_lacks_is_not_netted_nor_held() -> None:
    damaged = _log((1, 4))[:2]  # #1 and #2 of a group through #4
    groups = NetGroups.of(True, damaged, 2, None)
    assert _parts(groups, 1, 3) == [(1, 2, False), (3, 3, False)]
    assert groups.held is None


def test_log_entries_name_their_group_and_older_logs_have_none() -> None:
    entries = _batch(3, 5).log_entries(after=3, netted=True)
    assert [(e.number, e.netted_through) for e in entries] == [(4, 5), (5, 5)]
    assert _LOG.validate_json(_LOG.dump_json(entries)) == entries
    older = b'[{"number": 7, "upstream_id": null, "ranges": {}}]'
    assert _LOG.validate_json(older)[0].netted_through is None


def test_netted_and_plain_parts_of_a_source_concatenate() -> None:
    """A source's changes come with `time` and `diff` not null (`arrow_schema(with_changes=
    True)`); netted ones keep that schema, so they join plain ones in either order, and so does
    a netted part whose changes all cancel."""
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("time", pa.int64(), False),
                        pa.field("diff", pa.int64(), False)])
    rows = pa.table({"k": [1, 1, 2], "time": [1, 2, 3], "diff": [1, -1, 1]}, schema)
    one = TransactionBatch.of([Transaction(number=n, offsets={}) for n in (1, 2, 3)],
                              {"s": Changes(rows)})
    head, tail = one.split(2)
    assert tail is not None
    for parts in ([Part(head, True), Part(tail, False)], [Part(head, False), Part(tail, True)]):
        changes = engine_changes(parts, {"s"})["s"]
        assert changes.table.schema == schema
    cancelled = engine_changes([Part(head, True), Part(tail, False)], {"s"})["s"]
    assert cancelled.table.to_pylist() == [{"k": 2, "time": 3, "diff": 1}]


def test_the_engine_gets_each_netted_part_at_its_last_transaction() -> None:
    rows = pa.table({"k": [1, 1, 2, 3], "time": [1, 2, 2, 3], "diff": [1, -1, 1, 1]})
    batch = TransactionBatch.of([Transaction(number=n, offsets={}) for n in (1, 2, 3)],
                                {"s": consolidate(rows, ["k"]), "t": consolidate(rows, ["k"])})
    first, rest = batch.split(2)
    assert rest is not None
    changes = engine_changes([Part(first, True), Part(rest, False)], {"s"})
    assert list(changes) == ["s"]
    assert changes["s"].table.to_pylist() == [{"k": 2, "time": 2, "diff": 1},
                                              {"k": 3, "time": 3, "diff": 1}]
