"""Decoded rows waiting for their transaction to close, per source, and the changes they make
once it does: consolidated for append-only and insert/delete sources, replacing the current
row of their key for upsert sources. One `Changes` per source for all the transactions that
close together. Pure: Arrow tables in, `Changes` out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF, TIME, Changes, consolidate, order
from txstream.schemas.sources import SourceSpec
from txstream.sources.kafka_source import (
    BOOKKEEPING,
    DELETE,
    SEQ,
    SIGN,
    TRUNCATE,
    BadRecord,
    RawRecords,
)
from txstream.sources.upsert import UpsertCounts, UpsertState

# Columns added to a pending row, next to the decoded ones.
TRANSACTION_KEY = "__transaction"  # the key of the open transaction the row belongs to
PARTITION = "__partition"
OFFSET = "__offset"
# The original record of a row of a source with upstream transactions, for its dead letter.
ORIGINAL_KEY, ORIGINAL_VALUE, ORIGINAL_HEADERS = "__key", "__value", "__headers"
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_INTERNAL = frozenset({*BOOKKEEPING, TRANSACTION_KEY, PARTITION, OFFSET, ORIGINAL_KEY,
                       ORIGINAL_VALUE, ORIGINAL_HEADERS})


def originals(records: RawRecords, at: Sequence[int]) -> pa.Table:
    """The key, value and headers of `records` at positions `at`, byte for byte."""
    return pa.table({
        ORIGINAL_KEY: pa.array([records.keys[i] for i in at], pa.binary()),
        ORIGINAL_VALUE: pa.array([records.values[i] for i in at], pa.binary()),
        ORIGINAL_HEADERS: pa.array([[{"key": k, "value": v} for k, v in records.headers[i] or ()]
                                    for i in at], _HEADERS),
    })


class PendingChanges:
    """The rows of the open transactions of every source (see the module doc)."""

    def __init__(self, sources: Sequence[SourceSpec]) -> None:
        self._sources = {s.name: s for s in sources}
        self._rows: dict[str, list[pa.Table]] = {s.name: [] for s in sources}
        self.upsert = {
            s.name: UpsertState(s.table_schema) for s in sources if s.semantics == "upsert"
        }
        self.upsert_counts = UpsertCounts()

    def add(self, source: str, rows: pa.Table, keys: pa.Array, partitions: pa.Array,
            offsets: pa.Array, records: pa.Table | None = None) -> None:
        """Decoded `rows` of `source`, each with the key of its open transaction (null: in
        none, left out), its record's partition and offset, and (`records`, from `originals`;
        given for every call of a source or for none) the record itself."""
        kept = pc.is_valid(keys)
        rows = (rows.append_column(TRANSACTION_KEY, keys).append_column(PARTITION, partitions)
                .append_column(OFFSET, offsets))
        for name in [] if records is None else records.column_names:
            rows = rows.append_column(name, records.column(name))
        rows = rows.filter(kept)
        if rows.num_rows:
            self._rows[source].append(rows)

    def latest(self, source: str, keys: pa.Table) -> dict[tuple[Any, ...], dict[str, Any] | None]:
        """The row each key of `keys` (a table of upsert source `source`'s primary key columns)
        has after the records read so far: its latest pending row (None for a delete), else its
        current row (None: it has none, or a pending truncate came after it)."""
        pk = list(self._sources[source].table_schema.primary_key)
        keys = keys.select(pk).group_by(pk, use_threads=False).aggregate([])
        found = self.upsert[source].current(keys)
        out = {tuple(k[c] for c in pk): row
               for k, row in zip(keys.to_pylist(), found, strict=True)}
        if self._rows[source]:
            names = [*self._sources[source].table_schema.names, SEQ, DELETE]
            rows = pa.concat_tables(self._rows[source])
            cut = pc.max(rows.filter(rows.column(TRUNCATE)).column(SEQ)).as_py()
            if cut is not None:  # what was before the latest truncate is gone
                out = dict.fromkeys(out)
                rows = rows.filter(pc.greater(rows.column(SEQ), cut))
            hit = rows.select(names).join(keys, keys=pk, join_type="inner").sort_by(SEQ)
            for row in hit.to_pylist():
                out[tuple(row[c] for c in pk)] = None if row[DELETE] else row
        return out

    def _split(self, source: str, numbers: Mapping[str, int]) -> tuple[pa.Table, pa.Array]:
        """Removes the rows of the transactions keyed in `numbers` from `source`'s pending
        rows; returns them with each one's number."""
        pending = self._rows[source]
        rows = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
        where = pc.index_in(rows.column(TRANSACTION_KEY),
                            value_set=pa.array(list(numbers), pa.string()))
        number = pc.take(pa.array(list(numbers.values()), pa.int64()), where)
        closed = pc.is_valid(number)
        rest = rows.filter(pc.invert(closed))
        self._rows[source] = [rest] if rest.num_rows else []
        return rows.filter(closed), number.filter(closed)

    def take(self, numbers: Mapping[str, int]) -> dict[str, Changes]:
        """The changes of the transactions closing now (key -> number), one `Changes` per
        source (empty for a source without rows in them)."""
        return {name: self._take(name, numbers) for name in self._sources}

    def _take(self, name: str, numbers: Mapping[str, int]) -> Changes:
        spec = self._sources[name]
        schema = spec.table_schema.arrow_schema(with_changes=True)
        if not self._rows[name]:
            return Changes(schema.empty_table())
        rows, number = self._split(name, numbers)
        rows = rows.append_column(TIME, number)
        if name in self.upsert:
            changes, counts = self.upsert[name].apply(rows)
            self.upsert_counts.absent_deletes += counts.absent_deletes
            self.upsert_counts.unchanged += counts.unchanged
            # Retractions then insertions per time already; ordering keeps that (stable).
            return Changes(order(changes))
        cols = spec.table_schema.names
        signed = rows.select([*cols, TIME, SIGN]).rename_columns([*cols, TIME, DIFF])
        return Changes(consolidate(signed, cols).table.cast(schema))

    def drop(self, key: str, upstream_id: str | None, reason: str) -> list[BadRecord]:
        """Removes the rows of open transaction `key` (never emitted): as dead letters, one per
        record, the original record where it was kept (`add`), else the row as JSON with its
        sign as `diff`."""
        bad: list[BadRecord] = []
        seen: set[tuple[str, int, int]] = set()
        for name, pending in self._rows.items():
            if not pending:
                continue
            rows = pa.concat_tables(pending)
            mine = pc.fill_null(pc.equal(rows.column(TRANSACTION_KEY), key), False)
            self._rows[name] = [rows.filter(pc.invert(mine))]
            topic = self._sources[name].topic
            for row in rows.filter(mine).to_pylist():
                where = (name, row[PARTITION], row[OFFSET])
                if ORIGINAL_VALUE in row:
                    if where in seen:  # an update's two rows (insert_delete)
                        continue
                    seen.add(where)
                    key, value = row[ORIGINAL_KEY], row[ORIGINAL_VALUE]
                    headers = [(h["key"], h["value"]) for h in row[ORIGINAL_HEADERS]]
                else:
                    own = {k: v for k, v in row.items() if k not in _INTERNAL}
                    key, value, headers = None, _json({**own, DIFF: row[SIGN]}), []
                bad.append(BadRecord(
                    source=name, topic=topic, partition=row[PARTITION], offset=row[OFFSET],
                    seq=row[SEQ], key=key, value=value, headers=headers, error=reason,
                    upstream_id=upstream_id,
                ))
        return bad

    def rows_before(self, later: Mapping[str, Sequence[Changes]]) -> dict[str, pa.Table]:
        """Each upsert source's current rows before the `later` changes it emitted."""
        rows: dict[str, pa.Table] = {}
        for name, upsert in self.upsert.items():
            tables = [c.table for c in later.get(name, ()) if c.num_rows]
            rows[name] = upsert.rows_before(pa.concat_tables(tables)) if tables else upsert.rows
        return rows

    def restore_upsert(self, rows: Mapping[str, pa.Table]) -> None:
        for name, state in self.upsert.items():
            self.upsert[name] = UpsertState(state.schema, rows[name])


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, default=str).encode()
