"""Deephaven-style update records computed from change batches."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.changes import Changes
from txstream.schemas.sinks import ModifiedRow, UpdateRecord
from txstream.schemas.tables import TableSchema
from txstream.sinks.update_records import update_records

SCHEMA = TableSchema.of({"k": "bigint", "a": "text", "b": "double", "c": "int"},
                        primary_key=["k"])


def batch(changes: list[tuple[dict[str, Any], int, int]],
          schema: TableSchema = SCHEMA) -> Changes:
    return Changes.of(pa.Table.from_pylist([{**r, "time": t, "diff": d} for r, t, d in changes],
                                           schema=schema.arrow_schema(with_changes=True)))


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


@st.composite
def keyed_stream(draw: st.DrawFn) -> list[tuple[dict[str, Any], int, int]]:
    state: dict[int, dict[str, Any]] = {}
    out: list[tuple[dict[str, Any], int, int]] = []
    for t in range(1, draw(st.integers(1, 6)) + 1):
        for k in draw(st.sets(st.integers(0, 4), max_size=4)):
            new = row(k, a=draw(st.sampled_from(["x", "y", None])),
                      b=draw(st.sampled_from([1.0, math.nan])), c=draw(st.integers(0, 1)))
            old = state.pop(k, None)
            if old is not None:
                out.append((old, t, -1))
            if draw(st.booleans()):
                out.append((new, t, 1))
                state[k] = new
    # Consolidate: an unchanged row deleted and re-inserted in one transaction cancels out.
    def ident(change: tuple[dict[str, Any], int, int]) -> str:
        return repr((sorted(change[0].items()), change[1]))
    counts: dict[str, int] = {}
    for change in out:
        counts[ident(change)] = counts.get(ident(change), 0) + change[2]
    return [c for c in out if counts[ident(c)] != 0]


@settings(max_examples=60, deadline=None)
@given(changes=keyed_stream())
def test_update_records_replay_the_stream(changes: list[tuple[dict[str, Any], int, int]]) -> None:
    """Applying the records in order (removes, then modifies, then adds) rebuilds the table;
    every modify's `before` is the current row and its columns are in `modified_columns`."""
    as_json = update_records(batch(changes), "t", SCHEMA)
    table: dict[int, dict[str, Any]] = {}
    for record in as_json:
        for removed in record.removed:
            assert table.pop(removed["k"]) == removed
        changed: set[str] = set()
        for m in record.modified:
            assert table[m.before["k"]] == m.before
            changed |= {c for c in m.after if m.after[c] != m.before[c]}
            table[m.after["k"]] = m.after
        assert set(record.modified_columns) == changed
        for added in record.added:
            assert added["k"] not in table
            table[added["k"]] = added
    expected: dict[int, dict[str, Any]] = {}
    for r, _, d in sorted(changes, key=lambda c: (c[1], c[2])):
        if d < 0:
            del expected[r["k"]]
        else:
            expected[r["k"]] = r
    json_expected = {k: {**r, "b": "NaN" if math.isnan(r["b"]) else r["b"]}
                     for k, r in expected.items()}
    assert table == json_expected
