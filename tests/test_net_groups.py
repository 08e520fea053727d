"""`txstream.service.net_groups`: fresh batches netted as one; a replay cut at the groups its log
names, each group netted again, transactions logged on their own computed as they were, and a
group whose end is yet to come held for the next batch, a group the progress row falls inside
replayed one transaction at a time."""

from __future__ import annotations

from txstream.service.net_groups import NetGroups
from txstream.sources.transaction_batch import Transaction, TransactionBatch, TransactionLogEntry


def _batch(first: int, last: int) -> TransactionBatch:
    return TransactionBatch.of([Transaction(number=n, offsets={})
                                for n in range(first, last + 1)], {})


def _log(*groups: tuple[int, int]) -> list[TransactionLogEntry]:
    """Entries of transactions logged in `groups` (first, last); a group of one: on its own."""
    return [TransactionLogEntry(number=n, upstream_id=None, ranges={},
                                netted_through=last if last > first else None)
            for first, last in groups for n in range(first, last + 1)]


def _parts(groups: NetGroups, first: int, last: int) -> list[tuple[int, int, bool]]:
    return [(p.first, p.last.number, netted) for p, netted in groups.parts(_batch(first, last))]


def test_fresh_batches_of_several_transactions_are_netted_when_the_sinks_allow() -> None:
    assert _parts(NetGroups.of(True, [], 0, None), 1, 5) == [(1, 5, True)]
    assert _parts(NetGroups.of(True, [], 0, None), 1, 1) == [(1, 1, False)]
    assert _parts(NetGroups.of(False, [], 0, None), 1, 5) == [(1, 5, False)]


def test_a_replay_nets_the_logged_groups_again_and_holds_an_unfinished_one() -> None:
    groups = NetGroups.of(True, _log((1, 1), (2, 4), (5, 5), (6, 9)), 9, None)
    assert _parts(groups, 1, 3) == [(1, 1, False)], "2..3 held: 4 is in their group"
    assert groups.held is not None
    assert _parts(groups, 4, 7) == [(2, 4, True), (5, 5, False)]
    assert _parts(groups, 8, 12) == [(6, 9, True), (10, 12, True)], "then fresh ones"
    assert groups.held is None


def test_transactions_logged_on_their_own_are_computed_together_not_netted() -> None:
    groups = NetGroups.of(True, _log((1, 1), (2, 2), (3, 3)), 3, 2)
    assert _parts(groups, 1, 5) == [(1, 3, False), (4, 5, True)]


def test_without_netting_now_a_replay_is_cut_the_same_but_not_netted() -> None:
    groups = NetGroups.of(False, _log((1, 3), (4, 5)), 5, 3)
    assert _parts(groups, 1, 6) == [(1, 3, False), (4, 5, False), (6, 6, False)]


def test_a_group_the_progress_row_falls_inside_is_replayed_one_at_a_time() -> None:
    """Its netted batch failed an expression and was computed one transaction at a time, the
    ones before the failing transaction committed: netted now, the replay would straddle them."""
    groups = NetGroups.of(True, _log((1, 2), (3, 6), (7, 8)), 8, 4)
    assert _parts(groups, 1, 8) == [(1, 2, True), (3, 6, False), (7, 8, True)]
