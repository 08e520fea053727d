"""Deephaven-style update records computed from change batches."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from connectors.update_records import update_records
from schemas.sinks import ModifiedRow, UpdateRecord
from schemas.tables import TableSchema

SCHEMA = TableSchema.of({"k": "bigint", "a": "text", "b": "double", "c": "int"},
                        primary_key=["k"])


def batch(changes: list[tuple[dict[str, Any], int, int]],
          schema: TableSchema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([{**r, "time": t, "diff": d} for r, t, d in changes],
                                schema=schema.arrow_schema(with_changes=True))


def row(k: int, a: str | None = "x", b: float = 1.0, c: int = 0) -> dict[str, Any]:
    return {"k": k, "a": a, "b": b, "c": c}


def test_inserts_modifies_deletes_and_reinserts() -> None:
    changes = batch([
        # time 1: three inserts
        (row(1), 1, 1), (row(2), 1, 1), (row(3, b=math.nan), 1, 1),
        # time 2: key 1 modified in one column, key 2 in two, key 3 deleted
        (row(1), 2, -1), (row(1, a="y"), 2, 1),
        (row(2), 2, -1), (row(2, b=2.0, c=5), 2, 1),
        (row(3, b=math.nan), 2, -1),
        # time 3: key 3 re-inserted, key 2 deleted and re-inserted in one transaction with a
        # changed null column: a modify; key 4 inserted
        (row(3, a=None), 3, 1),
        (row(2, b=2.0, c=5), 3, -1), (row(2, a=None, b=2.0, c=5), 3, 1),
        (row(4), 3, 1),
    ])
    records = update_records(changes, "orders", SCHEMA)
    assert [r.time for r in records] == [1, 2, 3]
    one, two, three = records
    assert [r["k"] for r in one.added] == [1, 2, 3]
    assert one.added[2]["b"] == "NaN"  # the JSON form of the rows is the sinks' one
    assert (one.removed, one.modified, one.modified_columns) == ([], [], [])

    assert two.added == []
    assert [r["k"] for r in two.removed] == [3]
    assert two.modified == [
        ModifiedRow(before=row(1), after=row(1, a="y")),
        ModifiedRow(before=row(2), after=row(2, b=2.0, c=5)),
    ]
    assert two.modified_columns == ["a", "b", "c"]

    assert [r["k"] for r in three.added] == [3, 4]
    assert three.removed == []
    assert three.modified == [ModifiedRow(before=row(2, b=2.0, c=5),
                                          after=row(2, a=None, b=2.0, c=5))]
    assert three.modified_columns == ["a"]


def test_modified_columns_of_one_modify_leave_the_others_out() -> None:
    changes = batch([(row(1, b=math.nan), 7, -1), (row(1, b=math.nan, c=1), 7, 1)])
    (record,) = update_records(changes, "t", SCHEMA)
    assert record.modified_columns == ["c"]  # NaN to NaN is no modification
    assert UpdateRecord.model_validate_json(record.model_dump_json()) == record


def test_unkeyed_tables_have_only_adds_and_removes() -> None:
    schema = TableSchema.of({"a": "text"})
    changes = batch([({"a": "x"}, 1, 2), ({"a": "y"}, 2, -1), ({"a": "x"}, 2, 1)], schema)
    first, second = update_records(changes, "log", schema)
    assert first.added == [{"a": "x"}, {"a": "x"}]
    assert (second.added, second.removed, second.modified) == ([{"a": "x"}], [{"a": "y"}], [])
