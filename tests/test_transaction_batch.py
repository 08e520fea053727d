"""The batch handed between the service's stages: built from consecutive transactions, checked
once."""

from __future__ import annotations

import pyarrow as pa
import pytest

from txstream.sources.transaction_batch import TransactionBatch, TransactionBatchError
from txstream.sources.transactions import Transaction


def _txn(number: int, rows: int, ranges: dict[str, dict[int, tuple[int, int]]],
         time: int | None = None) -> Transaction:
    table = pa.table({"k": list(range(rows)), "time": [time or number] * rows,
                      "diff": [1] * rows})
    return Transaction(number=number, changes={"s": table, "empty": table.slice(0, 0)},
                       offsets={t: {p: end for p, (_, end) in parts.items()}
                                for t, parts in ranges.items()}, ranges=ranges)


def test_a_batch_joins_its_transactions_changes_and_offset_ranges() -> None:
    batch = TransactionBatch.of([
        _txn(4, 2, {"a": {0: (10, 12)}}),
        _txn(5, 3, {"a": {0: (12, 14), 1: (3, 4)}}),
    ])
    assert (batch.first, batch.last.number, len(batch), batch.rows) == (4, 5, 2, 5)
    assert set(batch.changes) == {"s"}, "sources without changes are left out"
    assert batch.changes["s"]["time"].to_pylist() == [4, 4, 5, 5, 5]
    assert batch.ranges == {"a": {0: (10, 14), 1: (3, 4)}}
    assert batch.offsets == {"a": {0: 14, 1: 4}}
    assert [e.number for e in batch.log_entries(after=4)] == [5]


def test_only_consecutive_transactions_form_a_batch() -> None:
    with pytest.raises(TransactionBatchError, match=r"not numbers \[4, 6\]"):
        TransactionBatch.of([_txn(4, 1, {}), _txn(6, 1, {})])
    with pytest.raises(TransactionBatchError, match="consecutive"):
        TransactionBatch.of([])


def test_changes_outside_the_batchs_transactions_are_refused() -> None:
    with pytest.raises(TransactionBatchError, match=r"source 's': changes at times 9\.\.9"):
        TransactionBatch.of([_txn(4, 1, {}, time=9)])
