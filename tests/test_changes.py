"""`txstream.changes`, pure (no Spark): a table of cases for every public function and method
(the changes in, the changes or the error out), then properties over random tables: `order` is
the same stable order as a sort by time, then diff, in every case (nulls and huge ranges too,
where it cannot use one rank column); `Changes.net` is one transaction, integrated the same.

Changes are written as rows `(k, time, diff)` of one nullable bigint column `k`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.changes import (
    DIFF,
    TIME,
    Changes,
    ChangesError,
    change_fields,
    consolidate,
    order,
)

Change = tuple[int | None, int | None, int | None]  # (k, time, diff)
K = pa.schema([pa.field("k", pa.int64())])


def table(*rows: Change) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                     TIME: pa.array([r[1] for r in rows], pa.int64()),
                     DIFF: pa.array([r[2] for r in rows], pa.int64())})


def changes(*rows: Change) -> Changes:
    return Changes(table(*rows))


def rows_of(c: Changes | pa.Table) -> list[Change]:
    t = c.table if isinstance(c, Changes) else c
    return list(zip(t["k"].to_pylist(), t[TIME].to_pylist(), t[DIFF].to_pylist(), strict=True))


def case(id_: str, *values: Any) -> Any:
    return pytest.param(*values, id=id_)


# --- building: the columns are checked, never the rows --------------------------------------

def _typed(**columns: tuple[list[Any], pa.DataType]) -> pa.Table:
    return pa.table({n: pa.array(v, t) for n, (v, t) in columns.items()})


I64 = pa.int64()
BAD_COLUMNS = [
    case("no columns", pa.table({}), r"exactly one 'time' column .*got columns \(none\): add it"),
    case("time missing", _typed(k=([1], I64), diff=([1], I64)),
         r"exactly one 'time' column .*got columns k, diff: add it"),
    case("diff missing", _typed(k=([1], I64), time=([1], I64)),
         r"exactly one 'diff' column .*got columns k, time: add it"),
    case("time twice", pa.Table.from_arrays([pa.array([1]), pa.array([1]), pa.array([1])],
                                            names=[TIME, TIME, DIFF]),
         r"exactly one 'time' column .*: rename the others"),
    case("diff before time", _typed(k=([1], I64), diff=([1], I64), time=([1], I64)),
         r"'time' then 'diff' as their last two columns; got columns k, diff, time: build "
         r"them with Changes.of"),
    case("own column last", _typed(time=([1], I64), diff=([1], I64), k=([1], I64)),
         r"last two columns; got columns time, diff, k"),
    case("time int32", _typed(k=([1], I64), time=([1], pa.int32()), diff=([1], I64)),
         r"are int64, but 'time' is int32: cast them"),
    case("diff double", _typed(k=([1], I64), time=([1], I64), diff=([1.0], pa.float64())),
         r"are int64, but 'diff' is double: cast them"),
    case("both of null type (built from empty lists)", pa.table({"k": [], TIME: [], DIFF: []}),
         r"but 'time' is null and 'diff' is null: cast them"),
]


@pytest.mark.parametrize(("t", "message"), BAD_COLUMNS)
def test_building_refuses_bad_columns(t: pa.Table, message: str) -> None:
    with pytest.raises(ChangesError, match=message):
        Changes(t)


@pytest.mark.parametrize(("t", "names"), [
    case("already last", table((1, 1, 1)), ["k", TIME, DIFF]),
    case("time and diff first", _typed(time=([1], I64), diff=([1], I64), k=([1], I64)),
         ["k", TIME, DIFF]),
    case("diff before time", _typed(diff=([1], I64), k=([1], I64), time=([1], I64)),
         ["k", TIME, DIFF]),
    case("no own column", _typed(time=([1], I64), diff=([1], I64)), [TIME, DIFF]),
])
def test_of_moves_time_and_diff_last(t: pa.Table, names: list[str]) -> None:
    assert Changes.of(t).table.column_names == names


@pytest.mark.parametrize(("t", "message"), [
    case("time missing", _typed(k=([1], I64), diff=([1], I64)), r"'time' column .*add it"),
    case("time twice", pa.Table.from_arrays([pa.array([1]), pa.array([1]), pa.array([1])],
                                            names=[TIME, DIFF, TIME]), r"rename the others"),
    case("diff int32", _typed(diff=([1], pa.int32()), time=([1], I64)),
         r"'diff' is int32: cast them"),
])
def test_of_refuses_what_moving_cannot_mend(t: pa.Table, message: str) -> None:
    with pytest.raises(ChangesError, match=message):
        Changes.of(t)


def test_rows_are_not_checked_when_built() -> None:
    """Zero diffs, duplicates and disorder are `validate`'s: building reads no row."""
    assert rows_of(changes((1, 2, 1), (1, 2, 1), (2, 1, 0))) == [(1, 2, 1), (1, 2, 1), (2, 1, 0)]


@pytest.mark.parametrize(("own", "names"), [
    case("no own column", pa.schema([]), [TIME, DIFF]),
    case("one", K, ["k", TIME, DIFF]),
    case("two, in their order", pa.schema([("b", pa.string()), ("a", pa.float64())]),
         ["b", "a", TIME, DIFF]),
])
def test_change_fields_and_empty(own: pa.Schema, names: list[str]) -> None:
    fields = change_fields(own)
    assert fields.names == names
    assert [(f.type, f.nullable) for f in fields][-2:] == [(pa.int64(), False)] * 2
    empty = Changes.empty(own)
    assert (empty.table.schema, empty.num_rows, empty.columns) == (fields, 0, names[:-2])


# --- reading ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("c", "size", "bounds"), [
    case("empty", changes(), 0, None),
    case("one transaction", changes((1, 4, 1), (2, 4, -1)), 2, (4, 4)),
    case("several", changes((1, 2, -1), (1, 2, 1), (3, 9, 1)), 3, (2, 9)),
])
def test_size_and_times(c: Changes, size: int, bounds: tuple[int, int] | None) -> None:
    assert (c.num_rows, len(c), c.columns) == (size, size, ["k"])
    assert c.time_range() == bounds
    assert c.last_time() == (bounds[1] if bounds else None)
    assert c.times.to_pylist() == [t for _, t, _ in rows_of(c)]


@pytest.mark.parametrize(("c", "count"), [
    case("empty", changes(), 0),
    case("insertions and deletions", changes((1, 1, 1), (2, 1, -1)), 0),
    case("multiset weights", changes((1, 1, 2), (2, 1, -3), (3, 1, 1)), 2),
    case("a zero (not consolidated)", changes((1, 1, 0)), 1),
])
def test_non_unit_diffs(c: Changes, count: int) -> None:
    assert c.non_unit_diffs() == count


# --- validate: consolidated and ordered, or a ChangesError saying which ----------------------

@pytest.mark.parametrize("rows", [
    case("empty", []),
    case("one insertion", [(1, 1, 1)]),
    case("an update: deletion first", [(1, 1, -1), (2, 1, 1)]),
    case("same row at two times", [(1, 1, 1), (1, 2, -1)]),
    case("multiset weight", [(1, 1, 2)]),
    case("null key", [(None, 1, 1), (1, 1, 1)]),
    case("deletions first, then larger weights", [(1, 1, -2), (2, 1, -1), (3, 1, 1)]),
])
def test_validate_accepts(rows: list[Change]) -> None:
    c = changes(*rows)
    assert c.validate() is c


@pytest.mark.parametrize(("rows", "message"), [
    case("a zero diff", [(1, 1, 1), (2, 1, 0)], r"1 change\(s\) have diff 0: consolidate"),
    case("time going back", [(1, 2, 1), (2, 1, 1)],
         r"out of order at row 1 \(time 1, diff 1\): order by time, deletions first"),
    case("insertion before deletion", [(1, 1, 1), (2, 1, -1)],
         r"out of order at row 1 \(time 1, diff -1\)"),
    case("a row twice at one time", [(1, 1, 1), (1, 1, 1)], r"not consolidated"),
    case("null keys twice at one time", [(None, 1, 1), (None, 1, 1)], r"not consolidated"),
    case("a pair that cancels", [(1, 1, -1), (1, 1, 1)], r"not consolidated"),
])
def test_validate_refuses(rows: list[Change], message: str) -> None:
    with pytest.raises(ChangesError, match=message):
        changes(*rows).validate()


# --- consolidate and order --------------------------------------------------------------------

@pytest.mark.parametrize(("rows", "want"), [
    case("empty", [], []),
    case("one", [(1, 1, 1)], [(1, 1, 1)]),
    case("duplicates summed", [(1, 1, 1), (1, 1, 1)], [(1, 1, 2)]),
    case("a pair that cancels is gone", [(1, 1, 1), (1, 1, -1)], []),
    case("zero diff dropped", [(1, 1, 0), (2, 1, 1)], [(2, 1, 1)]),
    case("nulls equal to nulls", [(None, 1, 1), (None, 1, 1)], [(None, 1, 2)]),
    case("null apart from a value", [(None, 1, 1), (0, 1, 1)], [(None, 1, 1), (0, 1, 1)]),
    case("same row, two times", [(1, 2, -1), (1, 1, 1)], [(1, 1, 1), (1, 2, -1)]),
    case("deletions before insertions", [(2, 1, 1), (1, 1, -1)], [(1, 1, -1), (2, 1, 1)]),
    case("by time first", [(1, 3, -1), (2, 1, 1), (3, 2, 1)],
         [(2, 1, 1), (3, 2, 1), (1, 3, -1)]),
])
def test_consolidate(rows: list[Change], want: list[Change]) -> None:
    got = consolidate(table(*rows), ["k"])
    assert sorted(rows_of(got), key=repr) == sorted(want, key=repr)
    assert [(t, d) for _, t, d in rows_of(got)] == [(t, d) for _, t, d in want], "ordered"
    got.validate()


def test_consolidate_keeps_the_columns_named() -> None:
    """Columns not named are dropped; rows equal on the named ones are then one row."""
    t = pa.table({"k": [1, 1], "v": ["a", "b"], TIME: [1, 1], DIFF: [1, 1]})
    assert consolidate(t, ["k"]).table.to_pylist() == [{"k": 1, TIME: 1, DIFF: 2}]


BIG = 2**62
ORDER_CASES = [
    case("empty", [], []),
    case("one", [(1, 5, 1)], [(1, 5, 1)]),
    case("already ordered", [(1, 1, -1), (2, 1, 1), (3, 2, 1)], [(1, 1, -1), (2, 1, 1), (3, 2, 1)]),
    case("by time", [(1, 2, 1), (2, 1, 1)], [(2, 1, 1), (1, 2, 1)]),
    case("deletions first", [(1, 1, 1), (2, 1, -1)], [(2, 1, -1), (1, 1, 1)]),
    case("stable among equals", [(3, 1, 1), (1, 1, 1), (2, 1, 1)],
         [(3, 1, 1), (1, 1, 1), (2, 1, 1)]),
    case("null time last", [(1, None, 1), (2, 1, 1)], [(2, 1, 1), (1, None, 1)]),
    case("null diff last in its time", [(1, 1, None), (2, 1, -1)], [(2, 1, -1), (1, 1, None)]),
    case("ranges too wide for one rank", [(1, BIG, 1), (2, -BIG, 1), (3, 0, -BIG)],
         [(2, -BIG, 1), (3, 0, -BIG), (1, BIG, 1)]),
]


@pytest.mark.parametrize(("rows", "want"), ORDER_CASES)
def test_order(rows: list[Change], want: list[Change]) -> None:
    assert rows_of(order(table(*rows))) == want


# --- the changes of some transactions ---------------------------------------------------------

THREE = changes((1, 1, 1), (1, 2, -1), (2, 2, 1), (3, 3, 1))


@pytest.mark.parametrize(("pick", "want"), [
    case("after None: all", lambda c: c.after(None), rows_of(THREE)),
    case("after one before all", lambda c: c.after(0), rows_of(THREE)),
    case("after the first", lambda c: c.after(1), [(1, 2, -1), (2, 2, 1), (3, 3, 1)]),
    case("after the last: none", lambda c: c.after(3), []),
    case("at one", lambda c: c.at(2), [(1, 2, -1), (2, 2, 1)]),
    case("at none held", lambda c: c.at(7), []),
    case("after, of none", lambda c: changes().after(1), []),
])
def test_after_and_at(pick: Callable[[Changes], Changes], want: list[Change]) -> None:
    got = pick(THREE)
    assert rows_of(got) == want
    assert got.table.schema == THREE.table.schema


@pytest.mark.parametrize(("rows", "time", "want"), [
    case("empty", [], 9, []),
    case("one transaction, moved", [(1, 1, 1), (2, 1, -1)], 9, [(2, 9, -1), (1, 9, 1)]),
    case("inserted then deleted: gone", [(1, 1, 1), (1, 2, -1)], 9, []),
    case("an update undone: gone", [(1, 1, -1), (2, 1, 1), (2, 2, -1), (1, 2, 1)], 9, []),
    case("updated twice: first to last", [(1, 1, -1), (2, 1, 1), (2, 2, -1), (3, 2, 1)], 5,
         [(1, 5, -1), (3, 5, 1)]),
    case("inserted twice: summed", [(1, 1, 1), (1, 2, 1)], 2, [(1, 2, 2)]),
    case("null keys net too", [(None, 1, 1), (None, 2, -1)], 2, []),
])
def test_net(rows: list[Change], time: int, want: list[Change]) -> None:
    given_ = changes(*rows)
    got = given_.net(time)
    assert rows_of(got) == want
    assert got.table.schema == given_.table.schema, "in the schema it came in"


@pytest.mark.parametrize(("first", "others", "want"), [
    case("nothing to add", changes((1, 1, 1)), [], [(1, 1, 1)]),
    case("to empty", changes(), [changes((1, 2, 1))], [(1, 2, 1)]),
    case("later transactions after", changes((1, 1, 1)), [changes((1, 2, -1)), changes(),
                                                          changes((2, 3, 1))],
         [(1, 1, 1), (1, 2, -1), (2, 3, 1)]),
])
def test_concat(first: Changes, others: list[Changes], want: list[Change]) -> None:
    assert rows_of(first.concat(others)) == want


# --- properties over random tables ------------------------------------------------------------

_VALUES = st.one_of(st.none(), st.integers(-3, 3), st.integers(-2**62, 2**62))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VALUES, _VALUES), max_size=40))
def test_order_is_a_stable_sort_by_time_then_diff(rows: list[tuple[int | None, int | None]]
                                                  ) -> None:
    t = pa.table({"row": list(range(len(rows))),
                  TIME: pa.array([t for t, _ in rows], pa.int64()),
                  DIFF: pa.array([d for _, d in rows], pa.int64())})
    want = t.sort_by([(TIME, "ascending"), (DIFF, "ascending")])
    assert order(t).to_pydict() == want.to_pydict()


def _integrated(t: pa.Table) -> dict[int, int]:
    weights: dict[int, int] = {}
    for row, diff in zip(t["row"].to_pylist(), t[DIFF].to_pylist(), strict=True):
        weights[row] = weights.get(row, 0) + diff
    return {row: w for row, w in weights.items() if w}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6), st.sampled_from([-1, 1])),
                max_size=30))
def test_net_is_one_transaction_integrated_the_same(changed: list[tuple[int, int, int]]
                                                    ) -> None:
    t = pa.table({"row": [r for r, _, _ in changed],
                  TIME: pa.array([t for _, t, _ in changed], pa.int64()),
                  DIFF: pa.array([d for _, _, d in changed], pa.int64())})
    netted = consolidate(t, ["row"]).net(9)
    assert netted.validate().table[TIME].to_pylist() == [9] * netted.num_rows
    assert _integrated(netted.table) == _integrated(t)
    assert netted.num_rows == len(_integrated(t)), "what cancels is gone"
