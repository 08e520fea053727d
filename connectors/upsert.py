"""Upsert by primary key, vectorized: records that replace (or delete) the current row of their
key become `-1 old, +1 new` changes, for many consecutive transactions in one pass.

The current rows are an Arrow table (one row per key), so the state is checkpointed as it is
(Parquet). Each `apply` costs one hash join of the touched keys against the current rows and
one filter of the current rows: O(changes + current rows) in C, once per call, which the
builder amortizes over all transactions closed by one poll.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from connectors.kafka_source import DELETE, SEQ
from schemas.tables import TableSchema

_ROW = "__row"
_STATE_ROW = "__state_row"


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


class UpsertState:
    """The current row of every key of one upsert source."""

    def __init__(self, schema: TableSchema, rows: pa.Table | None = None) -> None:
        self.schema = schema
        self._arrow = schema.arrow_schema()
        self._keys = list(schema.primary_key)
        self._columns = schema.names
        self.rows = self._arrow.empty_table() if rows is None else rows.select(self._columns).cast(
            self._arrow
        )

    def apply(self, records: pa.Table) -> tuple[pa.Table, UpsertCounts]:
        """`records`: the source's columns, `time` (transaction number), SEQ (consumption order)
        and DELETE. Returns the changes (columns + time + diff, consolidated) and counters."""
        cols, keys = self._columns, self._keys
        out_schema = self.schema.arrow_schema(with_changes=True)
        if records.num_rows == 0:
            return out_schema.empty_table(), UpsertCounts()
        order = [(k, "ascending") for k in keys] + [("time", "ascending"), (SEQ, "ascending")]
        r = records.select([*cols, "time", SEQ, DELETE]).sort_by(order)
        # Several records of a key in one transaction net to the last one.
        r = r.filter(pa.array(~np.append(_same_as_next(r, [*keys, "time"]), False)))
        n, n_state = r.num_rows, self.rows.num_rows
        same_key = _same_as_next(r, keys)
        first_of_key = ~np.insert(same_key, 0, False)
        last_of_key = ~np.append(same_key, False)
        deleted = r.column(DELETE).to_numpy(zero_copy_only=False)

        # The old row of each record: the key's current row for its first transaction here,
        # the record of the previous transaction for the next ones. Indices point into
        # `current + r` so one `take` fetches both kinds.
        firsts = np.flatnonzero(first_of_key)
        probe = r.select(keys).take(pa.array(firsts)).append_column(_ROW, pa.array(firsts))
        state_keys = self.rows.select(keys).append_column(
            _STATE_ROW, pa.array(np.arange(n_state, dtype=np.int64))
        )
        hits = probe.join(state_keys, keys=keys, join_type="inner")
        hit_rows = hits.column(_ROW).to_numpy()
        hit_state = hits.column(_STATE_ROW).to_numpy()
        old = np.full(n, -1, dtype=np.int64)
        old[hit_rows] = hit_state
        later = np.flatnonzero(~first_of_key)
        live_prev = later[~deleted[later - 1]]
        old[live_prev] = n_state + live_prev - 1

        has_old = old >= 0
        with_old = np.flatnonzero(has_old)
        combined = pa.concat_tables([self.rows, r.select(cols).cast(self._arrow)])
        old_rows = combined.take(pa.array(old[with_old]))
        changed = np.ones(n, dtype=bool)
        changed[with_old] = ~_rows_equal(old_rows, r.take(pa.array(with_old)), cols)

        time = r.column("time").combine_chunks()
        retract = (deleted | changed)[with_old]
        minus = old_rows.filter(pa.array(retract))
        minus_time = time.take(pa.array(with_old[retract]))
        plus_mask = ~deleted & changed
        plus = r.filter(pa.array(plus_mask))
        changes = pa.concat_tables(
            [
                minus.append_column("time", minus_time).append_column(
                    "diff", pa.array(np.full(minus.num_rows, -1, dtype=np.int64))
                ).cast(out_schema),
                plus.select([*cols, "time"]).append_column(
                    "diff", pa.array(np.ones(plus.num_rows, dtype=np.int64))
                ).cast(out_schema),
            ]
        )

        keep = np.ones(n_state, dtype=bool)
        keep[hit_state] = False
        survivors = r.filter(pa.array(last_of_key & ~deleted)).select(cols).cast(self._arrow)
        self.rows = pa.concat_tables([self.rows.filter(pa.array(keep)), survivors])
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
        earliest = later.group_by(keys, use_threads=False).aggregate([("time", "min")])
        firsts = later.join(earliest, keys=keys, join_type="inner")
        was = pc.and_(pc.equal(firsts.column("time"), firsts.column("time_min")),
                      pc.equal(firsts.column("diff"), -1))
        restored = firsts.filter(was).select(self._columns).cast(self._arrow)
        untouched = self.rows.join(earliest.select(keys), keys=keys, join_type="left anti")
        return pa.concat_tables([untouched.select(self._columns).cast(self._arrow), restored])

