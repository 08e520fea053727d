"""Debezium records of an upsert source whose meaning depends on the key's row before them,
resolved as they are read. Pure: the decoded rows in, the rows to keep out; the key's row
before them comes from `latest` (`PendingChanges.latest`: the latest record read of each key,
else its current row).

* A tombstone (the key, no value; `tombstones.on.delete=true`, Debezium's default) follows
  every delete, for Kafka's log compaction. When its key has no row (the delete before it was
  read) it changes nothing: it is skipped, joins no transaction and is no dead letter. When its
  key still has a row, the tombstone is the only trace of the deletion (compaction removed the
  delete event while the service was stopped): it deletes the row, in a mini-batch of its own
  (it has no transaction id, like a snapshot read).
* An unchanged TOAST value: with `REPLICA IDENTITY DEFAULT`, an update that does not touch a
  TOASTed column carries the connector's `unavailable.value.placeholder` instead of its value
  (`SourceSpec.placeholder`; base64 of its bytes for a bytes column, which is read as text).
  Such a text column takes the value of the key's row before the update. Without one (the
  service started after the row was written) the change is rejected with that reason, to the
  dead-letter topic, rather than storing the placeholder.
  An insert_delete source keeps no rows: `resolve_updates` takes the value from the update's
  own `before` image (complete with `REPLICA IDENTITY FULL`), else rejects the change.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.sources import SourceSpec
from txstream.schemas.tables import ColumnType
from txstream.sources.field_checks import as_mask
from txstream.sources.kafka_source import DELETE, SEQ, SIGN, TRUNCATE

Key = tuple[Any, ...]
Latest = Callable[[pa.Table], dict[Key, dict[str, Any] | None]]


@dataclass
class Resolved:
    rows: pa.Table  # the rows to keep, unchanged TOAST values filled in
    skipped: list[int] = field(default_factory=list)  # positions of tombstones changing nothing
    rejected: dict[int, str] = field(default_factory=dict)  # position -> reason


def placeholders(spec: SourceSpec) -> list[str]:
    """The texts that stand for an unchanged TOAST value of `spec`'s text columns."""
    if spec.placeholder is None:
        return []
    return [spec.placeholder, base64.b64encode(spec.placeholder.encode()).decode()]


def _text_columns(spec: SourceSpec) -> list[str]:
    pk = set(spec.table_schema.primary_key)
    return [c.name for c in spec.table_schema.columns
            if c.type is ColumnType.TEXT and c.name not in pk and c.name not in spec.metadata]


def _unchanged(spec: SourceSpec, rows: pa.Table) -> np.ndarray:
    """Per row, whether a text column holds the placeholder."""
    marks = pa.array(placeholders(spec), pa.string())
    found = np.zeros(rows.num_rows, dtype=bool)
    for col in _text_columns(spec):
        found |= as_mask(pc.fill_null(pc.is_in(rows.column(col), value_set=marks), False))
    return found


def _reason(spec: SourceSpec, columns: list[str], where: str) -> str:
    return (f"unchanged TOAST value (the placeholder {spec.placeholder!r}) in column(s) "
            f"{columns}, and {where} to take it from: give the table REPLICA IDENTITY FULL, or "
            "snapshot it again (Debezium's incremental snapshot)")


def resolve_updates(spec: SourceSpec, rows: pa.Table) -> Resolved:
    """`rows` of insert_delete source `spec`: an update's new row (+1) takes its unchanged TOAST
    values from its old row (-1, same SEQ); a change whose values are not there is rejected."""
    toast = _unchanged(spec, rows)
    if not toast.any():
        return Resolved(rows)
    seqs = set(rows.column(SEQ).filter(pa.array(toast)).to_pylist())
    involved = as_mask(pc.is_in(rows.column(SEQ), value_set=pa.array(list(seqs), pa.int64())))
    out = Resolved(rows.filter(pa.array(~involved)))
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for row in rows.filter(pa.array(involved)).to_pylist():
        by_seq.setdefault(row[SEQ], []).append(row)
    marks, text = set(placeholders(spec)), _text_columns(spec)
    kept: list[dict[str, Any]] = []
    for seq, pair in by_seq.items():
        old = next((r for r in pair if r[SIGN] < 0), None)
        unchanged = [c for r in pair for c in text if r[c] in marks]
        if old is None or any(old[c] in marks for c in unchanged):
            out.rejected[seq] = _reason(spec, sorted(set(unchanged)),
                                        "the change has no complete 'before' image")
            continue
        kept += [{**r, **{c: old[c] for c in unchanged}} for r in pair]
    out.rows = pa.concat_tables([out.rows, pa.Table.from_pylist(kept, schema=rows.schema)]
                                ).sort_by(SEQ)
    return out


def resolve(spec: SourceSpec, rows: pa.Table, tombstones: Sequence[int],
            latest: Latest) -> Resolved:
    """`rows` (decoded, with bookkeeping) of upsert source `spec`, `tombstones` the positions
    (SEQ) of those read from tombstones: see the module doc. A truncate among `rows` leaves
    every key without a row for the rows after it."""
    pk, text = list(spec.table_schema.primary_key), _text_columns(spec)
    toast = _unchanged(spec, rows) & ~as_mask(rows.column(DELETE))
    tombs = as_mask(pc.is_in(rows.column(SEQ), value_set=pa.array(tombstones, pa.int64())))
    if not (toast | tombs).any():
        return Resolved(rows)
    truncates = as_mask(rows.column(TRUNCATE))
    keys = rows.select(pk)
    wanted = set(map(tuple, zip(*(keys.filter(pa.array(toast | tombs)).column(c).to_pylist()
                                  for c in pk), strict=True)))
    involved = np.fromiter((k in wanted for k in zip(*(keys.column(c).to_pylist() for c in pk),
                                                      strict=True)), bool, rows.num_rows)
    current = latest(keys.filter(pa.array(involved)))
    involved |= truncates
    out = Resolved(rows.filter(pa.array(~involved)))
    tomb_set, mark_set = set(tombstones), set(placeholders(spec))
    kept: list[dict[str, Any]] = []
    for row in sorted(rows.filter(pa.array(involved)).to_pylist(), key=lambda r: r[SEQ]):
        if row[TRUNCATE]:
            current = dict.fromkeys(current)
            kept.append(row)
            continue
        key = tuple(row[c] for c in pk)
        before = current.get(key)
        if row[SEQ] in tomb_set and before is None:
            out.skipped.append(row[SEQ])
            continue
        unchanged = [c for c in text if row[c] in mark_set and not row[DELETE]]
        if unchanged and before is None:
            out.rejected[row[SEQ]] = _reason(
                spec, unchanged, f"key {dict(zip(pk, key, strict=True))} has no row (the "
                "service started after the row was written)")
            continue
        row = {**row, **{c: before[c] for c in unchanged}} if before else row
        current[key] = None if row[DELETE] else row
        kept.append(row)
    out.rows = pa.concat_tables([out.rows, pa.Table.from_pylist(kept, schema=rows.schema)]
                                ).sort_by(SEQ)
    return out
