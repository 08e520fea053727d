"""Live tables (connectors/live) and the update model (txstream/updates): randomized
transactions of inserts, deletes and updates on a keyed table; after each, a mirror that
applied the updates equals the server's table and a from-scratch integration of the
changes, and every update keeps Barrage's invariants (checked by `TableUpdate.validate`)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.live_rows import change_row

from txstream.sinks.live.keyspace import allocate
from txstream.sinks.live.table import LiveTable, LiveTableError
from txstream.updates import (
    ROW_KEY,
    Mirror,
    Shift,
    TableUpdate,
    UpdateError,
    from_ranges,
    same_rows,
    shifted,
    to_ranges,
)

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])


def changes(rows: list[tuple[tuple[int, str | None, int | None], int]], t: int) -> pa.Table:
    return pa.table({
        "k": [r[0] for r, _ in rows], "name": [r[1] for r, _ in rows],
        "qty": [r[2] for r, _ in rows], "time": [t] * len(rows), "diff": [d for _, d in rows],
    })


def expected(state: dict[int, tuple[int, str | None, int | None]],
             key: list[str] | None = None) -> pa.Table:
    """The rows in primary key order (`k`, or (`name`, `k`))."""
    rows = sorted(state.values(), key=lambda r: (r[1], r[0]) if key == ["name", "k"] else r[0])
    return pa.table({"k": [r[0] for r in rows], "name": [r[1] for r in rows],
                     "qty": [r[2] for r in rows]}, schema=SCHEMA)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spacing", [1, 3, 1 << 16])
@pytest.mark.parametrize("key", [["k"], ["name", "k"]])
def test_a_mirror_follows_random_transactions(seed: int, spacing: int, key: list[str]) -> None:
    """With a numeric key (rows placed by binary search) and a composite one (sorted)."""
    rng = random.Random(seed)
    live = LiveTable("t", SCHEMA, key, spacing=spacing)
    mirror = Mirror(SCHEMA)
    mirror.apply(live.snapshot())
    late = Mirror(SCHEMA)  # joins later, from a snapshot
    state: dict[int, tuple[int, str | None, int | None]] = {}
    shifts = modifies = 0
    for t in range(1, 60):
        batch: list[tuple[tuple[int, str | None, int | None], int]] = []
        touched: set[int] = set()
        for _ in range(rng.randrange(0, 25)):
            k = rng.randrange(0, 80)
            if k in touched:
                continue
            touched.add(k)
            name = rng.choice(["a", "b", None]) if key == ["k"] else k % 3 * "ab"
            new = (k, name, rng.choice([1, 2, None]))
            change_row(state, new, k in state and rng.random() < 0.4, batch)
        rng.shuffle(batch)
        update = live.apply(changes(batch, t), t)
        mirror.apply(update)
        shifts += len(update.shifts)
        modifies += len(update.modified)
        assert update.transaction == t
        assert same_rows(live.table, expected(state, key))
        assert same_rows(mirror.rows(), live.snapshot().rows)
        if t == 30:
            late.apply(live.snapshot())
        elif t > 30:
            late.apply(update)
            assert same_rows(late.rows(), mirror.rows())
        for column, keys in update.modified_columns.items():
            assert column != "k" and len(keys)
    assert modifies
    if spacing == 1:
        assert shifts  # no free keys: every insertion between two rows shifts


def test_modified_columns_name_exactly_the_columns_that_changed() -> None:
    live = LiveTable("t", SCHEMA, ["k"])
    live.apply(changes([((1, "a", 1), 1), ((2, "b", 2), 1)], 1), 1)
    update = live.apply(changes([((1, "a", 1), -1), ((1, "a", 5), 1), ((2, "b", 2), -1),
                                 ((2, "c", 2), 1)], 2), 2)
    key1, key2 = live.keys
    assert list(update.modified) == [key1, key2]
    assert {c: list(k) for c, k in update.modified_columns.items()} == {
        "qty": [key1], "name": [key2]}
    assert not len(update.added) and not len(update.removed) and not update.shifts


def test_an_insertion_with_no_free_key_shifts_the_rows_after_it() -> None:
    live = LiveTable("t", SCHEMA, ["k"], spacing=1)
    live.apply(changes([((k, "x", k), 1) for k in (1, 2, 4)], 1), 1)
    assert list(live.keys) == [0, 1, 2]
    update = live.apply(changes([((3, "y", 3), 1)], 2), 2)
    assert update.shifts == (Shift(2, 2, 1),)
    assert list(update.added) == [2] and list(live.keys) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad, message", [
    ([((9, "x", 1), -1)], "does not hold"),
    ([((1, "other", 1), -1)], "differs from the one held"),
    ([((1, "x", 1), 1)], "already holds"),
    ([((5, "x", 1), 1), ((5, "y", 1), 1)], "already holds"),
    ([((5, "x", 1), 2)], r"other than -1 and \+1"),
])
def test_changes_that_do_not_fit_the_table_are_refused(
    bad: list[tuple[tuple[int, str, int], int]], message: str
) -> None:
    live = LiveTable("t", SCHEMA, ["k"])
    live.apply(changes([((1, "x", 1), 1)], 1), 1)
    with pytest.raises(LiveTableError, match=message):
        live.apply(changes(bad, 2), 2)


def test_outputs_without_a_primary_key_cannot_be_live() -> None:
    with pytest.raises(LiveTableError, match="no primary key"):
        LiveTable("t", SCHEMA, [])


def test_keys_past_the_limit_are_renumbered_and_sent_as_a_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("txstream.sinks.live.table.KEY_LIMIT", 100)
    live = LiveTable("t", SCHEMA, ["k"], spacing=60)
    mirror = Mirror(SCHEMA)
    updates = []
    for t, k in enumerate([1, 5, 3], start=1):
        updates.append(live.apply(changes([((k, "x", k), 1)], t), t))
        mirror.apply(updates[-1])
    # 1 takes key 59, 5 would take 119: past the limit, so the table is keyed anew.
    assert [u.snapshot for u in updates] == [False, True, False]
    assert list(updates[1].added) == [0, 60] and list(live.keys) == [0, 30, 60]
    assert same_rows(mirror.rows(), live.snapshot().rows)


# ---- the model's pure parts --------------------------------------------------------------


@given(st.lists(st.integers(0, 200), unique=True))
def test_ranges_round_trip(values: list[int]) -> None:
    keys = np.array(sorted(values), dtype=np.int64)
    ranges = to_ranges(keys)
    assert np.array_equal(from_ranges(ranges), keys)
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(ranges))


@settings(max_examples=300)
@given(st.lists(st.booleans(), max_size=40), st.integers(1, 5), st.integers(0, 3))
def test_allocated_keys_keep_order_and_survivors_only_shift(
    new: list[bool], spacing: int, gap: int
) -> None:
    """Survivors keep their keys up to a shift, every key is distinct and in order, and the
    shifts move exactly the survivors to their new keys."""
    old = np.cumsum(np.full(len(new), gap + 1, dtype=np.int64))
    slots = np.where(np.array(new, dtype=bool), -1, old)
    keys, shifts = allocate(slots, spacing)
    assert (keys >= 0).all() and (np.diff(keys) > 0).all()
    survivors = slots >= 0
    assert np.array_equal(shifted(slots[survivors], shifts), keys[survivors])
    assert all(s.delta > 0 for s in shifts)


def test_validate_refuses_updates_that_break_the_invariants() -> None:
    rows = pa.table({ROW_KEY: pa.array([5], pa.int64())})
    before = np.array([1, 2, 3], dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)

    def update(**kw: object) -> TableUpdate:
        base: dict[str, object] = dict(transaction=1, removed=none, shifts=(),
                                       added=np.array([5]), modified=none,
                                       modified_columns={}, rows=rows)
        return TableUpdate(**{**base, **kw})  # type: ignore[arg-type]

    update().validate(before)
    for bad, message in [
        (update(removed=np.array([9])), "lacks"),
        (update(shifts=(Shift(1, 1, 2),)), "reorder or collide"),
        (update(shifts=(Shift(2, 3, 1), Shift(1, 1, 1))), "overlap or are out of order"),
        (update(added=np.array([3]), rows=pa.table({ROW_KEY: pa.array([3], pa.int64())})),
         "exist"),
        (update(modified=np.array([7])), "lacks"),
        (update(rows=rows.slice(0, 0)), "not exactly"),
    ]:
        with pytest.raises(UpdateError, match=message):
            bad.validate(before)


def test_a_deleted_row_matches_the_held_one_with_nulls_and_nan() -> None:
    schema = pa.schema([("k", pa.int64()), ("x", pa.float64())])
    live = LiveTable("t", schema, ["k"])

    def rows(values: list[tuple[int, float | None]], diff: int, t: int) -> pa.Table:
        return pa.table({"k": [v[0] for v in values], "x": [v[1] for v in values],
                         "time": [t] * len(values), "diff": [diff] * len(values)})

    live.apply(rows([(1, float("nan")), (2, None)], 1, 1), 1)
    update = live.apply(rows([(1, float("nan")), (2, None)], -1, 2), 2)
    assert len(update.removed) == 2 and live.table.num_rows == 0
