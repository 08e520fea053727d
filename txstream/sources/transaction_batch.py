"""Closed transactions, and a batch of them: what the input hands to compute and compute on to
deliver.

A `Transaction` is a closed transaction's identity: its number, its upstream id, the offset
ranges of its records and the offsets safe to commit once it is delivered. A `TransactionBatch`
is consecutive transactions with each source's changes over all of them as one `Changes`
(the input builds one table per source per poll; batches are joined and split at transaction
boundaries, never cut into one table per transaction). Checked once, when built: numbers
consecutive, every change's time one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from pydantic import BaseModel, Field

from txstream.changes import Changes

Offsets = dict[str, dict[int, int]]  # topic -> partition -> next offset to consume
Ranges = dict[str, dict[int, tuple[int, int]]]  # topic -> partition -> [first, end) offsets


class TransactionLogEntry(BaseModel):
    """A transaction's identity: rebuilt from the same records with the same number on replay
    (a mini-batch by its offset ranges, an upstream transaction by its id)."""

    number: int
    upstream_id: str | None
    ranges: Ranges
    # The last transaction of the transactions this one was netted with, computed as one
    # (`Changes.net`); None: not netted. A replay nets the same transactions together again
    # (`txstream.service.net_groups`).
    netted_through: int | None = None
    # Its wall time (epoch ms), which now() reads; None: not taken (no now() in the pipeline).
    # A tick transaction has no ranges and is replayed from this alone.
    wall_time_ms: int | None = None


class Transaction(BaseModel):
    """One closed stream transaction (its changes are in its batch's `changes`)."""

    number: int
    # Topic -> partition -> next offset to consume once this transaction is done.
    offsets: Offsets
    upstream_id: str | None = None
    # Topic -> partition -> [first, last + 1) offsets of this transaction's records.
    ranges: Ranges = Field(default_factory=dict)
    # Epoch ms: its records' latest wall time (`PolledRecords.timestamps`), or when it ticked
    # (`TransactionLogEntry`).
    wall_time_ms: int | None = None

    def wall_time(self) -> datetime | None:
        """The wall time as now() sees it (None: not taken)."""
        if self.wall_time_ms is None:
            return None
        return datetime.fromtimestamp(self.wall_time_ms / 1000, tz=UTC)

    def log_entry(self, netted_through: int | None = None) -> TransactionLogEntry:
        """What to record (before the sinks see it) to rebuild this transaction after a crash,
        and to compute it again as it was (`netted_through`)."""
        return TransactionLogEntry(number=self.number, upstream_id=self.upstream_id,
                                   ranges=self.ranges, netted_through=netted_through,
                                   wall_time_ms=self.wall_time_ms)


class TransactionBatchError(ValueError):
    """Transactions that cannot form one batch (not consecutive, changes outside them)."""


@dataclass(frozen=True)
class TransactionBatch:
    transactions: tuple[Transaction, ...]
    # Source -> its changes over every transaction of the batch; sources without a change in
    # the batch are absent.
    changes: Mapping[str, Changes]
    # Topic -> partition -> [first, end) offsets of every record of the batch.
    ranges: Ranges

    @classmethod
    def of(cls, transactions: Sequence[Transaction],
           changes: Mapping[str, Changes]) -> TransactionBatch:
        """`transactions` (consecutive numbers) with their `changes`, one per source."""
        numbers = [t.number for t in transactions]
        if not numbers or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            raise TransactionBatchError(
                f"a batch holds consecutive transactions, not numbers {numbers}")
        kept = {name: c for name, c in sorted(changes.items()) if c.num_rows}
        for name, c in kept.items():
            lo, hi = c.time_range() or (numbers[0], numbers[0])
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
        return cls(tuple(transactions), kept, ranges)

    @classmethod
    def join(cls, batches: Sequence[TransactionBatch]) -> TransactionBatch:
        """Consecutive batches as one: each source's changes, already ordered by time in each,
        follow one another."""
        if len(batches) == 1:
            return batches[0]
        names = sorted({name for b in batches for name in b.changes})
        changes = {}
        for name in names:
            parts = [b.changes[name] for b in batches if name in b.changes]
            changes[name] = parts[0].concat(parts[1:])
        return cls.of([t for b in batches for t in b.transactions], changes)

    def split(self, count: int) -> tuple[TransactionBatch, TransactionBatch | None]:
        """The batch's first `count` transactions, and the rest (None when there is none): each
        source's changes cut where the time passes the last of the first ones."""
        if count >= len(self.transactions):
            return self, None
        cut = self.first + count
        head: dict[str, Changes] = {}
        tail: dict[str, Changes] = {}
        for name, c in self.changes.items():
            at = int(np.searchsorted(c.times.to_numpy(), cut))
            head[name], tail[name] = Changes(c.table.slice(0, at)), Changes(c.table.slice(at))
        return (TransactionBatch.of(self.transactions[:count], head),
                TransactionBatch.of(self.transactions[count:], tail))

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
        return sum(c.num_rows for c in self.changes.values())

    def __len__(self) -> int:
        return len(self.transactions)

    def log_entries(self, after: int, netted: bool = False) -> list[TransactionLogEntry]:
        """The log entries of the batch's transactions numbered above `after`; `netted`: the
        batch is computed as one transaction."""
        through = self.last.number if netted else None
        return [t.log_entry(through) for t in self.transactions if t.number > after]
