"""Upsert by primary key, vectorized: records that replace (or delete) the current row of their
key become `-1 old, +1 new` changes, for many consecutive transactions in one pass.

The current rows (one per key) are kept so that a call costs O(its records), not O(rows):
- `base`: a large Arrow table with a hash index of its keys (pandas, built once per
  compaction) and an `alive` bitmap; rows replaced or deleted since are marked dead,
- `delta`: a small Arrow table with the current row of every key touched since the last
  compaction, probed through an index rebuilt on each call (O(delta)).
When the delta outgrows 1/32 of the base (or as many base rows are dead), the two are
compacted into a new base: O(rows), amortized over as many changed keys.
The rows are checkpointed as one Arrow table (Parquet) through `rows`.
A truncate record (a Debezium `op: t`) deletes every current row at its place among the
records: O(rows), once per truncate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from txstream.changes import DIFF, TIME, consolidate
from txstream.schemas.tables import TableSchema
from txstream.sources.kafka_source import DELETE, SEQ, TRUNCATE

_COMPACT_MIN = 2_000


class UpsertCounts(BaseModel):
    absent_deletes: int = 0  # deletes of a key that had no current row: nothing emitted
    unchanged: int = 0  # upserts equal to the current row: nothing emitted


def _same_as_next(table: pa.Table, columns: list[str]) -> np.ndarray:
    """`out[i]`: row i and row i+1 agree on `columns` (which hold no nulls)."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for col in columns:
        arr = table.column(col).combine_chunks()
        same &= pc.equal(arr.slice(0, n - 1), arr.slice(1)).to_numpy(zero_copy_only=False)
    return same


def _rows_equal(a: pa.Table, b: pa.Table, columns: list[str]) -> np.ndarray:
    """Row-wise equality of two aligned tables, a null equal to a null."""
    equal = np.ones(a.num_rows, dtype=bool)
    for col in columns:
        x, y = a.column(col), b.column(col)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same = pc.or_(pc.fill_null(pc.equal(x, y), False), both_null)
        equal &= same.to_numpy(zero_copy_only=False)
    return equal


def _key_index(table: pa.Table, keys: list[str]) -> pd.Index:
    arrays = [table.column(k).to_numpy() for k in keys]
    return pd.Index(arrays[0]) if len(arrays) == 1 else pd.MultiIndex.from_arrays(arrays)


class UpsertState:
    """The current row of every key of one upsert source."""

    def __init__(self, schema: TableSchema, rows: pa.Table | None = None,
                 compact_min: int = _COMPACT_MIN) -> None:
        self.schema = schema
        self._compact_min = compact_min
        self._arrow = schema.arrow_schema()
        self._keys = list(schema.primary_key)
        self._columns = schema.names
        start = self._arrow.empty_table() if rows is None else rows.select(self._columns)
        self._compact(start.cast(self._arrow))

    @property
    def rows(self) -> pa.Table:
        return pa.concat_tables([self._base.filter(pa.array(self._alive)), self._delta])

    def _compact(self, rows: pa.Table) -> None:
        self._base = rows.combine_chunks()
        self._alive = np.ones(self._base.num_rows, dtype=bool)
        self._dead = 0
        self._index = _key_index(self._base, self._keys)
        self._delta = self._arrow.empty_table()

    def _lookup(self, probe: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the `probe` keys' current rows in the base and in the delta (-1: not
        there; a key is in at most one of them)."""
        keys = _key_index(probe, self._keys)
        in_base = np.asarray(self._index.get_indexer(keys))
        hit = in_base >= 0
        in_base[hit] = np.where(self._alive[in_base[hit]], in_base[hit], -1)
        # The delta changes on every call: its index is rebuilt, O(delta).
        in_delta = np.asarray(_key_index(self._delta, self._keys).get_indexer(keys))
        return in_base, in_delta

    def current(self, keys: pa.Table) -> list[dict[str, Any] | None]:
        """The current row of each key of `keys` (a table of the primary key columns), None
        for a key without one."""
        if keys.num_rows == 0:
            return []
        in_base, in_delta = self._lookup(keys.select(self._keys))
        base = dict(zip(np.flatnonzero(in_base >= 0).tolist(),
                        self._base.take(pa.array(in_base[in_base >= 0])).to_pylist(),
                        strict=True))
        delta = dict(zip(np.flatnonzero(in_delta >= 0).tolist(),
                         self._delta.take(pa.array(in_delta[in_delta >= 0])).to_pylist(),
                         strict=True))
        return [base.get(i, delta.get(i)) for i in range(keys.num_rows)]

    def apply(self, records: pa.Table) -> tuple[pa.Table, UpsertCounts]:
        """`records`: the source's columns, `time` (transaction number), SEQ (consumption order),
        DELETE and optionally TRUNCATE. Returns the changes (columns + time + diff,
        consolidated) and counters."""
        if TRUNCATE not in records.column_names or not pc.any(records[TRUNCATE]).as_py():
            return self._apply(records)
        records = records.sort_by([(TIME, "ascending"), (SEQ, "ascending")])
        marks = np.flatnonzero(records.column(TRUNCATE).to_numpy(zero_copy_only=False))
        parts: list[pa.Table] = []
        counts = UpsertCounts()
        start = 0
        for at in [*marks.tolist(), records.num_rows]:
            # The records before the truncate first: it deletes what they leave too.
            for step in range(2 if at < records.num_rows else 1):
                changes, more = self._apply(records.slice(start, at - start) if step == 0
                                            else self._everything(records.slice(at, 1)))
                parts.append(changes)
                counts.absent_deletes += more.absent_deletes
                counts.unchanged += more.unchanged
            start = at + 1
        # A row inserted and truncated in one transaction cancels out.
        out = consolidate(pa.concat_tables(parts), self._columns).table
        return out.cast(self.schema.arrow_schema(with_changes=True)), counts

    def _everything(self, truncate: pa.Table) -> pa.Table:
        """A delete of every current row, at the place (time, SEQ) of the `truncate` record."""
        rows = self.rows
        n = rows.num_rows
        at = {TIME: truncate[TIME][0].as_py(), SEQ: truncate[SEQ][0].as_py(), DELETE: True}
        for name, value in at.items():
            rows = rows.append_column(name, pa.array(np.full(n, value)))
        return rows

    def _apply(self, records: pa.Table) -> tuple[pa.Table, UpsertCounts]:
        """`apply` of records without truncates."""
        cols, keys = self._columns, self._keys
        out_schema = self.schema.arrow_schema(with_changes=True)
        if records.num_rows == 0:
            return out_schema.empty_table(), UpsertCounts()
        order = [(k, "ascending") for k in keys] + [(TIME, "ascending"), (SEQ, "ascending")]
        r = records.select([*cols, TIME, SEQ, DELETE]).sort_by(order)
        # Several records of a key in one transaction net to the last one.
        r = r.filter(pa.array(~np.append(_same_as_next(r, [*keys, TIME]), False)))
        n = r.num_rows
        same_key = _same_as_next(r, keys)
        first_of_key = ~np.insert(same_key, 0, False)
        last_of_key = ~np.append(same_key, False)
        deleted = r.column(DELETE).to_numpy(zero_copy_only=False)
        values = r.select(cols).cast(self._arrow)

        # The old row of each record: the key's current row for its first transaction here,
        # the record of the previous transaction for the next ones.
        firsts = np.flatnonzero(first_of_key)
        in_base, in_delta = self._lookup(values.select(keys).take(pa.array(firsts)))
        later = np.flatnonzero(~first_of_key)
        live_prev = later[~deleted[later - 1]]
        sources = [
            (self._base, in_base[in_base >= 0], firsts[in_base >= 0]),
            (self._delta, in_delta[in_delta >= 0], firsts[in_delta >= 0]),
            (values, live_prev - 1, live_prev),
        ]
        with_old_unsorted = np.concatenate([rows for _, _, rows in sources])
        order_old = np.argsort(with_old_unsorted, kind="stable")
        with_old = with_old_unsorted[order_old]
        old_rows = pa.concat_tables(
            [table.take(pa.array(at)) for table, at, _ in sources]
        ).take(pa.array(order_old))
        has_old = np.zeros(n, dtype=bool)
        has_old[with_old] = True
        changed = np.ones(n, dtype=bool)
        changed[with_old] = ~_rows_equal(old_rows, values.take(pa.array(with_old)), cols)

        time = r.column(TIME).combine_chunks()
        retract = (deleted | changed)[with_old]
        minus = old_rows.filter(pa.array(retract))
        minus_time = time.take(pa.array(with_old[retract]))
        plus = values.filter(pa.array(~deleted & changed))
        plus_time = time.filter(pa.array(~deleted & changed))
        changes = pa.concat_tables([
            minus.append_column(TIME, minus_time).append_column(
                DIFF, pa.array(np.full(minus.num_rows, -1, dtype=np.int64))
            ).cast(out_schema),
            plus.append_column(TIME, plus_time).append_column(
                DIFF, pa.array(np.ones(plus.num_rows, dtype=np.int64))
            ).cast(out_schema),
        ])

        # Every key touched now has its current row in the delta, or none.
        replaced = in_base[in_base >= 0]  # alive until now: a key is in the base once
        self._alive[replaced] = False
        self._dead += len(replaced)
        keep = np.ones(self._delta.num_rows, dtype=bool)
        keep[in_delta[in_delta >= 0]] = False
        survivors = values.filter(pa.array(last_of_key & ~deleted))
        self._delta = pa.concat_tables(
            [self._delta.filter(pa.array(keep)), survivors]
        ).combine_chunks()
        limit = max(self._compact_min, self._base.num_rows // 32)
        if self._delta.num_rows > limit or self._dead > limit:
            self._compact(self.rows)
        counts = UpsertCounts(
            absent_deletes=int((deleted & ~has_old).sum()),
            unchanged=int((has_old & ~deleted & ~changed).sum()),
        )
        return changes, counts

    def rows_before(self, later: pa.Table) -> pa.Table:
        """The current rows as they were before `later`: changes this state emitted since then
        (columns + time + diff). A key's row then is the one its earliest later transaction
        retracted; a key that transaction only inserted had none."""
        if later.num_rows == 0:
            return self.rows
        keys = self._keys
        earliest = later.group_by(keys, use_threads=False).aggregate([(TIME, "min")])
        firsts = later.join(earliest, keys=keys, join_type="inner")
        was = pc.and_(pc.equal(firsts.column(TIME), firsts.column(f"{TIME}_min")),
                      pc.equal(firsts.column(DIFF), -1))
        restored = firsts.filter(was).select(self._columns).cast(self._arrow)
        untouched = self.rows.join(earliest.select(keys), keys=keys, join_type="left anti")
        return pa.concat_tables([untouched.select(self._columns).cast(self._arrow), restored])
