"""The invariants checked where changes cross a stage (`txstream.service.invariants`): each
violation is named with its stage, transaction and a sample row; valid changes pass."""

from __future__ import annotations

import pyarrow as pa
import pytest

from txstream.changes import Changes
from txstream.engine import InvariantError
from txstream.service.invariants import check_engine_input, check_keyed_outputs


def _changes(rows: list[tuple[int, str, int, int]]) -> Changes:
    """(k, v, time, diff) rows, as they come."""
    return Changes(pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                             "v": pa.array([r[1] for r in rows], pa.string()),
                             "time": pa.array([r[2] for r in rows], pa.int64()),
                             "diff": pa.array([r[3] for r in rows], pa.int64())}))


GOOD = [(1, "a", 3, 1), (1, "a", 4, -1), (1, "b", 4, 1), (2, "c", 5, 1)]


def test_valid_input_and_outputs_pass() -> None:
    check_engine_input({"s": _changes(GOOD), "empty": _changes([])}, 3, 5, {})
    check_engine_input({"s": _changes(GOOD)}, 3, 5, {"s": ["k"]})
    check_keyed_outputs({"o": _changes(GOOD), "multiset": _changes([(1, "a", 3, 2)])},
                        {"o": ["k"], "multiset": []})


@pytest.mark.parametrize(("rows", "first", "problem", "time"), [
    ([(1, "a", 3, 1), (2, "b", 6, 1)], 3, "time 6 outside the batch's transactions 3..5", 6),
    ([(1, "a", 2, 1)], 3, "time 2 outside", 2),
    ([(1, "a", 3, 0)], 3, "diff 0", 3),
    ([(1, "a", 4, 1), (2, "b", 3, 1)], 3, "out of order", 3),
    ([(1, "a", 4, 1), (1, "b", 4, -1)], 3, "out of order", 4),
    ([(1, "a", 4, 1), (1, "a", 4, 1)], 3, "not consolidated", 4),
])
def test_engine_input_violations_are_named(rows: list[tuple[int, str, int, int]], first: int,
                                           problem: str, time: int) -> None:
    with pytest.raises(InvariantError, match=problem) as caught:
        check_engine_input({"orders": _changes(rows)}, first, 5, {})
    message = str(caught.value)
    assert "source 'orders'" in message and f"at transaction {time}" in message
    assert "sample row: {'k': " in message and "bug of txstream" in message
    assert caught.value.transaction == time


@pytest.mark.parametrize(("rows", "problem"), [
    ([(1, "a", 3, 1), (1, "b", 4, 1)], "inserted twice in a row: its multiplicity would be 2"),
    ([(1, "a", 3, -1), (1, "b", 4, -1)], "deleted twice in a row: its multiplicity would be -1"),
    ([(1, "a", 3, 1), (1, "a", 4, -1), (1, "a", 5, -1)], "deleted twice"),
    ([(None, "a", 3, 1), (None, "b", 3, 1)], "inserted twice"),  # a null key is a key
    ([(1, "a", 3, 2)], "diff 2 of a keyed table"),
])
def test_keyed_output_violations_are_named(rows: list[tuple[int, str, int, int]],
                                           problem: str) -> None:
    with pytest.raises(InvariantError, match=problem) as caught:
        check_keyed_outputs({"paid": _changes(rows)}, {"paid": ["k"]})
    assert "output 'paid'" in str(caught.value)


def test_an_upsert_source_is_checked_as_a_keyed_table() -> None:
    with pytest.raises(InvariantError, match=r"source 'orders'.*inserted twice"):
        check_engine_input({"orders": _changes([(1, "a", 3, 1), (1, "b", 4, 1)])}, 3, 5,
                           {"orders": ["k"]})


def test_keys_with_nulls_apart_from_others_pass() -> None:
    check_keyed_outputs({"o": _changes([(None, "a", 3, 1), (1, "b", 3, 1), (2, "c", 3, 1)])},
                        {"o": ["k"]})
