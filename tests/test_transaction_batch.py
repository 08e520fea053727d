"""The batch handed between the service's stages: built from consecutive transactions and one
`Changes` per source, checked once; joined and split at transaction boundaries."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.changes import DIFF, TIME, Changes
from txstream.sources.transaction_batch import (
    Ranges,
    Transaction,
    TransactionBatch,
    TransactionBatchError,
)


def _txn(number: int, ranges: Ranges) -> Transaction:
    return Transaction(number=number, ranges=ranges,
                       offsets={t: {p: end for p, (_, end) in parts.items()}
                                for t, parts in ranges.items()})


def _changes(rows_per_time: dict[int, int]) -> Changes:
    times = [t for t, n in sorted(rows_per_time.items()) for _ in range(n)]
    return Changes(pa.table({"k": list(range(len(times))), TIME: pa.array(times, pa.int64()),
                             DIFF: pa.array([1] * len(times), pa.int64())}))


def test_a_batch_joins_its_transactions_offset_ranges() -> None:
    batch = TransactionBatch.of(
        [_txn(4, {"a": {0: (10, 12)}}), _txn(5, {"a": {0: (12, 14), 1: (3, 4)}})],
        {"s": _changes({4: 2, 5: 3}), "empty": _changes({})},
    )
    assert (batch.first, batch.last.number, len(batch), batch.rows) == (4, 5, 2, 5)
    assert set(batch.changes) == {"s"}, "sources without changes are left out"
    assert batch.ranges == {"a": {0: (10, 14), 1: (3, 4)}}
    assert batch.offsets == {"a": {0: 14, 1: 4}}
    assert [e.number for e in batch.log_entries(after=4)] == [5]


def test_only_consecutive_transactions_form_a_batch() -> None:
    with pytest.raises(TransactionBatchError, match=r"not numbers \[4, 6\]"):
        TransactionBatch.of([_txn(4, {}), _txn(6, {})], {})
    with pytest.raises(TransactionBatchError, match="consecutive"):
        TransactionBatch.of([], {})


def test_changes_outside_the_batchs_transactions_are_refused() -> None:
    with pytest.raises(TransactionBatchError, match=r"source 's': changes at times 9\.\.9"):
        TransactionBatch.of([_txn(4, {})], {"s": _changes({9: 1})})


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 3), min_size=1, max_size=8), data=st.data())
def test_split_then_join_gives_the_batch_back(sizes: list[int], data: st.DataObject) -> None:
    """Cut anywhere, each part holds exactly its transactions' changes; joined, the parts are
    the batch again."""
    first = 7
    numbers = range(first, first + len(sizes))
    batch = TransactionBatch.of([_txn(n, {"t": {0: (n, n + 1)}}) for n in numbers],
                                {"s": _changes(dict(zip(numbers, sizes, strict=True)))})
    count = data.draw(st.integers(1, len(sizes)))
    head, tail = batch.split(count)
    assert len(head) == count and head.first == first
    got = head.changes["s"].table[TIME].to_pylist() if "s" in head.changes else []
    assert got == [n for n in numbers[:count] for _ in range(sizes[n - first])]
    if tail is None:
        assert count == len(sizes)
        return
    assert tail.first == first + count
    joined = TransactionBatch.join([head, tail])
    assert joined.transactions == batch.transactions and joined.ranges == batch.ranges
    assert {n: c.table for n, c in joined.changes.items()} == \
        {n: c.table for n, c in batch.changes.items()}
