"""A batch of transactions: what the ingest stage hands to compute and compute on to deliver.

Consecutive closed transactions, with each source's changes over all of them as one table, the
offsets to commit once the last is delivered, and the offset ranges their records span.
Checked once, when built: numbers consecutive, every change's `time` one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from txstream.sources.transactions import Offsets, Ranges, Transaction, TransactionLogEntry


class TransactionBatchError(ValueError):
    """Transactions that cannot form one batch (not consecutive, changes outside them)."""


@dataclass(frozen=True)
class TransactionBatch:
    transactions: tuple[Transaction, ...]
    # Source -> its columns + time + diff over every transaction of the batch; sources
    # without a change in the batch are absent.
    changes: Mapping[str, pa.Table]
    # Topic -> partition -> [first, end) offsets of every record of the batch.
    ranges: Ranges

    @classmethod
    def of(cls, transactions: Sequence[Transaction]) -> TransactionBatch:
        numbers = [t.number for t in transactions]
        if not numbers or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            raise TransactionBatchError(
                f"a batch holds consecutive transactions, not numbers {numbers}")
        changes: dict[str, pa.Table] = {}
        for name in sorted({name for t in transactions for name in t.changes}):
            parts = [t.changes[name] for t in transactions
                     if name in t.changes and t.changes[name].num_rows]
            if parts:
                changes[name] = pa.concat_tables(parts)
        for name, table in changes.items():
            lo, hi = pc.min(table["time"]).as_py(), pc.max(table["time"]).as_py()
            if lo < numbers[0] or hi > numbers[-1]:
                raise TransactionBatchError(
                    f"source {name!r}: changes at times {lo}..{hi}, outside the batch's "
                    f"transactions {numbers[0]}..{numbers[-1]}")
        ranges: Ranges = {}
        for t in transactions:
            for topic, parts in t.ranges.items():
                for p, (first, end) in parts.items():
                    lo_offset, hi_offset = ranges.setdefault(topic, {}).get(p, (first, end))
                    ranges[topic][p] = (min(lo_offset, first), max(hi_offset, end))
        return cls(tuple(transactions), changes, ranges)

    @property
    def first(self) -> int:
        return self.transactions[0].number

    @property
    def last(self) -> Transaction:
        """The last transaction: committing it commits the batch."""
        return self.transactions[-1]

    @property
    def offsets(self) -> Offsets:
        """The offsets to resume from once the batch is delivered."""
        return self.last.offsets

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.changes.values())

    def __len__(self) -> int:
        return len(self.transactions)

    def log_entries(self, after: int) -> list[TransactionLogEntry]:
        """The log entries of the batch's transactions numbered above `after`."""
        return [t.log_entry() for t in self.transactions if t.number > after]
