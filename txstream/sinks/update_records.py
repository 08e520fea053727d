"""Deephaven-style update records: per transaction, the added, removed and modified rows of a
table and the set of modified columns.

For a keyed table a deletion and an insertion of one key in one transaction is a modify (the
consolidated form of Deephaven's modified row); the modified columns are those whose value
differs between the two rows of at least one modify (NaN equals NaN, null equals null). A table
without a key has no identity across rows, so its changes are only additions and removals, a
row with diff n counting n times.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.sinks import ModifiedRow, UpdateRecord
from txstream.schemas.tables import TableSchema
from txstream.sinks.change_json import json_columns
from txstream.sinks.conform import conform_changes
from txstream.updates import same_values

_BEFORE = "before:"  # prefix of the old row's columns after the join; ':' is no identifier


def update_records(changes: Changes, table: str, schema: TableSchema) -> list[UpdateRecord]:
    """One record per distinct `time` in `changes`, in time order, rows sorted by key."""
    batch = conform_changes(changes, schema, by_key=True).table
    if batch.num_rows == 0:
        return []
    if not schema.primary_key:
        return _unkeyed_records(batch, table, schema)
    key = list(schema.primary_key)
    values = [n for n in schema.names if n not in key]
    inserted = pc.equal(batch[DIFF], 1)
    after = batch.filter(inserted).drop_columns([DIFF]).append_column(
        "after?", pa.repeat(True, pc.sum(inserted).as_py() or 0))
    before = batch.filter(pc.invert(inserted)).drop_columns([DIFF])
    before = before.rename_columns(
        [n if n in key or n == TIME else _BEFORE + n for n in before.column_names]
    ).append_column("before?", pa.repeat(True, before.num_rows))
    joined = after.join(before, keys=[*key, TIME], join_type="full outer")
    joined = joined.sort_by([(TIME, "ascending"), *((k, "ascending") for k in key)])

    has_after = pc.is_valid(joined["after?"])
    has_before = pc.is_valid(joined["before?"])
    modified = pc.and_(has_after, has_before)
    # Per row and value column: does a modify change it? Then per time: does any?
    differs = pa.table({TIME: joined[TIME], **{
        name: pc.and_(modified, pc.invert(same_values(joined[name], joined[_BEFORE + name])))
        for name in values
    }})
    changed = {
        row.pop(TIME): [name for name in values if row[f"{name}_any"]]
        for row in differs.group_by(TIME).aggregate([(n, "any") for n in values]).to_pylist()
    }
    new = json_columns(joined.select(schema.names))
    old = json_columns(joined.select([n if n in key else _BEFORE + n for n in schema.names]))
    old = {name.removeprefix(_BEFORE): column for name, column in old.items()}
    times = joined[TIME].to_pylist()
    kinds = zip(has_after.to_pylist(), has_before.to_pylist(), strict=True)
    records: dict[int, UpdateRecord] = {}
    for i, (time, (is_after, is_before)) in enumerate(zip(times, kinds, strict=True)):
        record = records.get(time)
        if record is None:
            record = records[time] = UpdateRecord(table=table, time=time)
        if is_after and is_before:
            record.modified.append(ModifiedRow(before=_row(old, i), after=_row(new, i)))
        elif is_after:
            record.added.append(_row(new, i))
        else:
            record.removed.append(_row(old, i))
    for time, record in records.items():
        record.modified_columns = changed[time]
    return list(records.values())


def _row(columns: dict[str, list[Any]], i: int) -> dict[str, Any]:
    return {name: column[i] for name, column in columns.items()}


def _unkeyed_records(batch: pa.Table, table: str, schema: TableSchema) -> list[UpdateRecord]:
    batch = batch.sort_by([(TIME, "ascending")])
    diffs = batch[DIFF].to_numpy()
    # A row of multiplicity n is n rows to Deephaven.
    repeated = batch.take(pa.array(np.repeat(np.arange(batch.num_rows), np.abs(diffs))))
    rows = json_columns(repeated.select(schema.names))
    records: dict[int, UpdateRecord] = {}
    times = repeated[TIME].to_pylist()
    for i, (time, diff) in enumerate(zip(times, repeated[DIFF].to_pylist(), strict=True)):
        record = records.setdefault(time, UpdateRecord(table=table, time=time))
        (record.added if diff > 0 else record.removed).append(_row(rows, i))
    return list(records.values())
