"""How a `TableUpdate` travels in an Arrow Flight stream: its rows (`ROW_KEY` plus the table's
columns) as record batches of at most `CHUNK_ROWS` rows, and everything else as JSON in the
first batch's app metadata:

    {"transaction": 12, "snapshot": false, "chunks": 1,
     "removed": [[lo, hi], ...], "added": [[lo, hi], ...], "modified": [[lo, hi], ...],
     "shifts": [[start, end, delta], ...], "modified_columns": {"qty": [[lo, hi], ...]},
     "first": 0, "size": 1000}

(`first` and `size` in a viewport's updates only: where its rows start in the sorted table, and
how many rows that has.)

Row sets are inclusive ranges of keys. A message of `chunks` batches carries metadata on the
first only; an update with no rows is one empty batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa

from txstream.updates import ROW_KEY, Shift, TableUpdate, from_ranges, to_ranges

CHUNK_ROWS = 65_536


class WireError(ValueError):
    """A stream message that is not a well-formed update."""


def stream_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a table's stream: its row key, then its columns."""
    return pa.schema([pa.field(ROW_KEY, pa.int64(), nullable=False), *schema])


def encode(update: TableUpdate, schema: pa.Schema) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """The batches of one update, each with its app metadata (empty after the first)."""
    rows = update.rows.select(schema.names).cast(schema).combine_chunks()
    batches = rows.to_batches(max_chunksize=CHUNK_ROWS) or [
        pa.RecordBatch.from_pylist([], schema=schema)]
    head = json.dumps({
        "transaction": update.transaction, "snapshot": update.snapshot,
        "chunks": len(batches),
        "removed": to_ranges(update.removed), "added": to_ranges(update.added),
        "modified": to_ranges(update.modified),
        "shifts": [[s.start, s.end, s.delta] for s in update.shifts],
        "modified_columns": {c: to_ranges(k) for c, k in update.modified_columns.items()},
        **({} if update.first is None else {"first": update.first, "size": update.size}),
    }).encode()
    for i, batch in enumerate(batches):
        yield batch, head if i == 0 else b""


def decode(metadata: bytes, batches: list[pa.RecordBatch], schema: pa.Schema) -> TableUpdate:
    """The update of a message: its first batch's `metadata` and all its `batches`."""
    try:
        head = json.loads(metadata)
        return TableUpdate(
            transaction=int(head["transaction"]),
            removed=from_ranges(head["removed"]),
            shifts=tuple(Shift(int(s), int(e), int(d)) for s, e, d in head["shifts"]),
            added=from_ranges(head["added"]),
            modified=from_ranges(head["modified"]),
            modified_columns={c: from_ranges(r) for c, r in head["modified_columns"].items()},
            rows=pa.Table.from_batches(batches, schema=schema),
            snapshot=bool(head["snapshot"]),
            first=None if head.get("first") is None else int(head["first"]),
            size=None if head.get("size") is None else int(head["size"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"not a txstream update message: {exc}") from exc


def chunks_of(metadata: bytes) -> int:
    """How many batches the message that `metadata` starts has."""
    try:
        return int(json.loads(metadata)["chunks"])
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"a message must start with update metadata: {exc}") from exc
