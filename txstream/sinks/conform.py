"""What every sink does to a `Changes` before writing it: conform it to the output table's
columns and Arrow types, and, for a sink that keeps one row per key, refuse weights other than
+1/-1.

The invariants of `Changes` itself (consolidated, ordered) are its own (`Changes.validate`);
a sink does not check them again.
"""

from __future__ import annotations

import pyarrow as pa

from txstream.changes import Changes
from txstream.schemas.tables import TableSchema
from txstream.sinks.sink import SinkDataError


def conform_changes(changes: Changes, schema: TableSchema, *, by_key: bool = False
                    ) -> Changes:
    """`changes` with exactly the schema's columns, `time` and `diff`, in order and Arrow types.
    `by_key`: the sink keeps one row per primary key (a snapshot, update records), so a change
    weighing other than +1/-1 is a SinkDataError."""
    expected = schema.arrow_schema(with_changes=True)
    table = changes.table
    missing = [n for n in expected.names if n not in table.column_names]
    if missing:
        raise SinkDataError(
            f"changes lack column(s) {', '.join(missing)}; expected {', '.join(expected.names)}"
        )
    try:
        conformed = Changes(table.select(expected.names).cast(expected))
    except (ValueError, pa.ArrowNotImplementedError) as exc:  # ArrowInvalid is a ValueError
        raise SinkDataError(f"changes do not convert to the table's column types: {exc}") from exc
    if by_key and schema.primary_key:
        bad = conformed.non_unit_diffs()
        if bad:
            raise SinkDataError(
                f"{bad} change(s) have a diff other than +1/-1: a keyed table holds each key at "
                "most once, so its changes must be consolidated single insertions and deletions"
            )
    return conformed
