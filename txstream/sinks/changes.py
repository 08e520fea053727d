"""Checks and shaping of a batch of changes (a table's columns plus `time` and `diff`) that
every sink applies before writing."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.tables import TableSchema
from txstream.sinks.sink import SinkDataError


def changes_columns(schema: TableSchema) -> list[str]:
    return [*schema.names, "time", "diff"]


def conform_changes(changes: pa.Table, schema: TableSchema) -> pa.Table:
    """`changes` with exactly the schema's columns, `time` and `diff`, in order and Arrow types."""
    expected = schema.arrow_schema(with_changes=True)
    missing = [n for n in expected.names if n not in changes.column_names]
    if missing:
        raise SinkDataError(
            f"changes lack column(s) {', '.join(missing)}; expected {', '.join(expected.names)}"
        )
    try:
        return changes.select(expected.names).cast(expected)
    except (ValueError, pa.ArrowNotImplementedError) as exc:  # ArrowInvalid is a ValueError
        raise SinkDataError(f"changes do not convert to the table's column types: {exc}") from exc


def check_unit_diffs(changes: pa.Table) -> None:
    """A keyed table changes each key by at most one insertion and one deletion per time."""
    bad = pc.sum(pc.invert(pc.is_in(changes["diff"], pa.array([-1, 1], pa.int64())))).as_py()
    if bad:
        raise SinkDataError(
            f"{bad} change(s) have a diff other than +1/-1: a keyed table holds each key at most "
            "once, so its changes must be consolidated single insertions and deletions"
        )
