"""A live table's change per transaction, Deephaven's way (its `TableUpdate`, Barrage's wire
order); the JSON `updates` format of file and Kafka sinks is another model,
`txstream.schemas.sinks.UpdateRecord`, which names rows by primary key. Here rows are
named by *row keys* (int64, ordered as the table is sorted, with gaps), and a `TableUpdate`
says which keys were removed, how surviving keys moved (`shifts`), which were added and which
were modified, and in which columns.

Applying an update to a copy of the table (`Mirror.apply`) follows Barrage's order:

1. drop the `removed` keys (pre-shift key space);
2. move the survivors by the `shifts` (each `[start, end]` of pre-shift keys by `delta`);
3. insert the `added` rows (post-shift key space);
4. overwrite the `modified` rows (post-shift key space).

Row sets travel as ranges of consecutive keys (`to_ranges`), the rows themselves as Arrow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROW_KEY = "__row_key"


class UpdateError(ValueError):
    """An update that breaks the model's invariants, or does not fit the table it is applied
    to: the sender and the receiver disagree about the table."""


def to_ranges(keys: np.ndarray) -> list[tuple[int, int]]:
    """Sorted, distinct `keys` as inclusive ranges of consecutive keys."""
    if not len(keys):
        return []
    breaks = np.flatnonzero(np.diff(keys) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(keys) - 1]])
    return [(int(keys[s]), int(keys[e])) for s, e in zip(starts, ends, strict=True)]


def from_ranges(ranges: Iterable[Iterable[int]]) -> np.ndarray:
    """The keys of inclusive ranges (`to_ranges`'s inverse)."""
    parts = [np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in ranges]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Shift:
    """The surviving rows whose keys lie in `[start, end]` move by `delta`."""

    start: int
    end: int
    delta: int


def shifted(keys: np.ndarray, shifts: Iterable[Shift]) -> np.ndarray:
    """`keys` (sorted) after `shifts`. Each key moves by the delta of the shift whose range
    holds it; the checks of `TableUpdate.validate` keep the result sorted."""
    out = keys.copy()
    for s in shifts:
        lo, hi = np.searchsorted(keys, [s.start, s.end + 1])
        out[lo:hi] += s.delta
    return out


@dataclass(frozen=True)
class TableUpdate:
    """What one transaction (or several, consolidated) did to a live table.

    `added` and `modified` are post-shift keys, `removed` pre-shift keys, all sorted and
    distinct. `rows` holds the added and modified rows (`ROW_KEY` plus the table's columns),
    sorted by key. `modified_columns` maps each column to the modified keys whose value of it
    changed. For a viewport's update, `first` is the position of its first row in the sorted
    table and `size` the table's row count (None for a whole table's)."""

    transaction: int
    removed: np.ndarray
    shifts: tuple[Shift, ...]
    added: np.ndarray
    modified: np.ndarray
    modified_columns: dict[str, np.ndarray]
    rows: pa.Table
    snapshot: bool = False  # the whole table: no removes, shifts or modifies
    first: int | None = None
    size: int | None = None

    def validate(self, before: np.ndarray) -> np.ndarray:
        """Check the update against the keys the table had `before` it (sorted); returns the
        keys after. Raises UpdateError on the first broken invariant. Costs O(rows) with
        binary searches for the changed keys, no sorting."""
        t = self.transaction
        for name in ("removed", "added", "modified"):
            keys = getattr(self, name)
            if len(keys) and not (np.diff(keys) > 0).all():
                raise UpdateError(f"transaction {t}: {name} keys are not sorted and distinct")
        if self.snapshot and (len(self.removed) or self.shifts or len(self.modified)):
            raise UpdateError(f"transaction {t}: a snapshot only adds rows")
        if not within(self.removed, before).all():
            raise UpdateError(f"transaction {t}: removes keys the table lacks")
        keep = np.ones(len(before), dtype=bool)
        keep[np.searchsorted(before, self.removed)] = False
        last_end = None
        for s in self.shifts:
            if s.start > s.end or s.delta == 0:
                raise UpdateError(f"transaction {t}: empty shift {s}")
            if last_end is not None and s.start <= last_end:
                raise UpdateError(f"transaction {t}: shifts overlap or are out of order")
            last_end = s.end
        moved = shifted(before[keep], self.shifts)
        if len(moved) and not (np.diff(moved) > 0).all():
            raise UpdateError(f"transaction {t}: shifts reorder or collide rows")
        if within(self.added, moved).any():
            raise UpdateError(f"transaction {t}: adds keys that exist")
        if not within(self.modified, moved).all():
            raise UpdateError(f"transaction {t}: modifies keys the table lacks")
        for column, keys in self.modified_columns.items():
            if not within(keys, self.modified).all():
                raise UpdateError(f"transaction {t}: column {column!r} has modified keys "
                                  "outside `modified`")
        sent = self.rows.column(ROW_KEY).to_numpy()
        changed = np.insert(self.modified, np.searchsorted(self.modified, self.added),
                            self.added)
        if not np.array_equal(sent, changed):
            raise UpdateError(f"transaction {t}: the rows sent are not exactly the added and "
                              "modified ones")
        return np.insert(moved, np.searchsorted(moved, self.added), self.added)


def within(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Which of `keys` are among `sorted_keys`, by binary search."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


class Mirror:
    """A copy of a live table kept by applying its updates: `keys` (sorted) and `table`, its
    rows in key order."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.keys = np.zeros(0, dtype=np.int64)
        self.table = schema.empty_table()
        self.transaction = 0

    def apply(self, update: TableUpdate) -> None:
        """Apply `update` (validated first: a mirror never takes an update that does not fit).
        One pass over the rows (a take), binary searches for the changed keys."""
        if update.snapshot:
            self.keys = np.zeros(0, dtype=np.int64)
            self.table = self.schema.empty_table()
        after = update.validate(self.keys)
        n = self.table.num_rows
        keep = np.ones(n, dtype=bool)
        keep[np.searchsorted(self.keys, update.removed)] = False
        source = np.flatnonzero(keep)  # row of `self.table` behind each surviving key
        moved = shifted(self.keys[source], update.shifts)
        sent_keys = update.rows.column(ROW_KEY).to_numpy()
        sent = update.rows.drop_columns([ROW_KEY]).select(self.schema.names).cast(self.schema)
        # Rows past `n` are the sent ones: modified keys take theirs, added keys come in.
        source[np.searchsorted(moved, update.modified)] = n + np.searchsorted(
            sent_keys, update.modified)
        at = np.searchsorted(moved, update.added)
        source = np.insert(source, at, n + np.searchsorted(sent_keys, update.added))
        self.table = pa.concat_tables([self.table, sent]).take(pa.array(source))
        self.keys = after
        self.transaction = update.transaction

    def rows(self) -> pa.Table:
        """The mirrored rows with their keys, in key order."""
        return self.table.add_column(0, ROW_KEY, pa.array(self.keys, pa.int64()))


def same_values(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray
                ) -> pa.Array | pa.ChunkedArray:
    """Row-wise equality as a key sees it: null equals null, NaN equals NaN."""
    same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return same


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Whether two tables hold the same rows in the same order."""
    if a.schema.names != b.schema.names or a.num_rows != b.num_rows:
        return False
    return all(pc.all(same_values(a.column(name), b.column(name).cast(a.schema.field(name).type))
                      ).as_py() is not False for name in a.schema.names)
