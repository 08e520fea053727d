"""Viewport subscriptions (connectors/live/viewport): randomized transactions of inserts,
deletes, updates and sort-key moves on a served table, several subscribers each on a range of
positions of the table sorted some way, their ranges moved at random between transactions.
After every transaction and every move, each subscriber's mirror (which validates every update
against Barrage's invariants) equals a from-scratch sort of the integrated table, sliced to the
subscriber's positions."""

from __future__ import annotations

import functools
import random

import pyarrow as pa
import pytest
from support.live_rows import change_row

from txstream.sinks.live.serving import LiveTables, UnknownSubscriptionError
from txstream.sinks.live.table import LiveTable
from txstream.updates import ROW_KEY, Mirror, TableUpdate, same_rows
from txstream.viewports import Viewport, ViewportError

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
Row = tuple[int, str | None, int | None]


def changes(rows: list[tuple[Row, int]], t: int) -> pa.Table:
    return pa.table({"k": [r[0] for r, _ in rows], "name": [r[1] for r, _ in rows],
                     "qty": [r[2] for r, _ in rows], "time": [t] * len(rows),
                     "diff": [d for _, d in rows]})


def in_order(state: dict[int, Row], sort: tuple[tuple[str, str], ...]) -> list[Row]:
    """The rows sorted by `sort` (nulls last either way) then by `k`: written out here,
    independent of the Arrow sort the server uses."""
    at = {"k": 0, "name": 1, "qty": 2}

    def compare(a: Row, b: Row) -> int:
        for column, direction in sort:
            x, y = a[at[column]], b[at[column]]
            if x == y:
                continue
            if x is None or y is None:
                return 1 if x is None else -1
            less = x < y  # type: ignore[operator]
            return (-1 if less else 1) * (1 if direction == "asc" else -1)
        return -1 if a[0] < b[0] else (a[0] > b[0])

    return sorted(state.values(), key=functools.cmp_to_key(compare))


def window(state: dict[int, Row], viewport: Viewport) -> pa.Table:
    rows = in_order(state, viewport.sort)[viewport.first:viewport.last + 1]
    return pa.table({"k": [r[0] for r in rows], "name": [r[1] for r in rows],
                     "qty": [r[2] for r in rows]}, schema=SCHEMA)


class Follower:
    """A subscriber in this process, draining its queue into a mirror."""

    def __init__(self, tables: LiveTables, viewport: Viewport, name: str) -> None:
        self.viewport = viewport
        self.name = name
        snapshot, self.subscriber = tables.subscribe("t", viewport, name)
        self.mirror = Mirror(SCHEMA)
        self.mirror.apply(snapshot)
        self.updates: list[TableUpdate] = []

    def drain(self, tables: LiveTables) -> None:
        served = tables.served("t")
        while (update := self.subscriber.next(served, 0)) is not None:
            self.mirror.apply(update)
            self.updates.append(update)

    def check(self, state: dict[int, Row], when: str) -> None:
        if self.updates:  # where the rows are, for a client that draws them
            assert (self.updates[-1].first, self.updates[-1].size) == \
                (self.viewport.first, len(state)), f"{self.name} {when}"
        got = self.mirror.table
        assert same_rows(got, window(state, self.viewport)), \
            f"{self.name} {self.viewport} {when}:\n{got.to_pylist()}\n" \
            f"want {window(state, self.viewport).to_pylist()}"


def random_batch(rng: random.Random, state: dict[int, Row]) -> list[tuple[Row, int]]:
    batch: list[tuple[Row, int]] = []
    for k in rng.sample(range(120), rng.randrange(0, 25)):
        new = (k, rng.choice(["a", "b", "c", None]), rng.choice([1, 2, 3, 4, None]))
        # An update often moves the row in a sorted view.
        change_row(state, new, k in state and rng.random() < 0.35, batch)
    rng.shuffle(batch)
    return batch


SORTS: list[tuple[tuple[str, str], ...]] = [
    (), (("qty", "desc"),), (("name", "asc"), ("qty", "desc")), (("qty", "asc"),),
]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("spacing", [1, 1 << 16])
def test_moving_viewports_follow_random_transactions(seed: int, spacing: int) -> None:
    rng = random.Random(seed)
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"], spacing=spacing)}, capacity=10_000)
    state: dict[int, Row] = {}
    followers: list[Follower] = []
    for t in range(1, 80):
        if t in (1, 20, 45):  # subscribers join an empty table and a full one
            for i, sort in enumerate(SORTS):
                first = rng.randrange(0, 30)
                followers.append(Follower(tables, Viewport.of(first, first + rng.randrange(8),
                                                              sort), f"s{t}.{i}"))
        tables.publish("t", changes(random_batch(rng, state), t))
        for f in followers:
            f.drain(tables)
            f.check(state, f"after transaction {t}")
            if rng.random() < 0.3:
                first = max(0, f.viewport.first + rng.randrange(-6, 7))
                f.viewport = f.viewport.moved(first, first + rng.randrange(10))
                tables.move("t", f.name, f.viewport.first, f.viewport.last)
                f.drain(tables)
                f.check(state, f"after a move at transaction {t}")
    updates = [u for f in followers for u in f.updates]
    assert any(len(u.shifts) for u in updates) or spacing > 1
    assert any(len(u.modified) for u in updates)
    assert any(len(u.removed) and len(u.added) for u in updates)  # rows leaving and entering
    tables.close()


def test_a_change_outside_the_viewport_sends_no_rows() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    tables.publish("t", changes([((k, "x", k), 1) for k in range(100)], 1))
    top = Follower(tables, Viewport.of(0, 9, [("qty", "desc")]), "top")
    assert top.mirror.table.column("k").to_pylist() == list(range(99, 89, -1))
    tables.publish("t", changes([((5, "x", 5), -1), ((5, "y", 6), 1)], 2))  # far below
    top.drain(tables)
    (quiet,) = top.updates
    assert quiet.transaction == 2 and quiet.rows.num_rows == 0
    assert not len(quiet.removed) and not len(quiet.added) and not quiet.shifts
    tables.publish("t", changes([((5, "y", 6), -1), ((5, "y", 1000), 1)], 3))  # to the top
    top.drain(tables)
    entered = top.updates[-1]
    assert entered.rows.column("k").to_pylist() == [5] and len(entered.removed) == 1
    assert top.mirror.table.column("k").to_pylist() == [5, *range(99, 90, -1)]
    tables.publish("t", changes([((98, "x", 98), -1), ((98, "z", 98), 1)], 4))
    top.drain(tables)
    modified = top.updates[-1]
    assert list(modified.modified_columns) == ["name"] and len(modified.modified) == 1
    assert modified.rows.column(ROW_KEY).to_pylist() == modified.modified.tolist()


def test_an_overflowing_viewport_subscriber_gets_a_snapshot_of_its_viewport() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])}, capacity=2)
    top = Follower(tables, Viewport.of(0, 2, [("qty", "desc")]), "top")
    state: dict[int, Row] = {}
    for t in range(1, 6):
        state[t] = (t, "x", t)
        tables.publish("t", changes([(state[t], 1)], t))
    top.drain(tables)
    assert top.subscriber.resyncs == 1 and top.updates[-1].snapshot
    top.check(state, "after the resync")


def test_viewport_requests_that_cannot_be_served_are_refused() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    with pytest.raises(ViewportError, match=r"no column.*'price'"):
        tables.subscribe("t", Viewport.of(0, 9, [("price", "asc")]))
    with pytest.raises(ViewportError, match="first <= last"):
        Viewport.of(5, 2)
    with pytest.raises(ViewportError, match="'up'"):
        Viewport.from_json({"first": 0, "last": 1, "sort": [["qty", "up"]]})
    tables.subscribe("t", None, "whole")
    with pytest.raises(UnknownSubscriptionError, match="no open viewport subscription"):
        tables.move("t", "whole", 0, 5)
    with pytest.raises(UnknownSubscriptionError):
        tables.move("t", "nobody", 0, 5)
    tables.subscribe("t", Viewport.of(0, 1), "v")
    with pytest.raises(ViewportError, match="already open"):
        tables.subscribe("t", Viewport.of(0, 1), "v")


def test_sorted_views_are_dropped_with_their_last_subscriber() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    served = tables.served("t")
    _, a = tables.subscribe("t", Viewport.of(0, 9, [("qty", "desc")]), "a")
    _, b = tables.subscribe("t", Viewport.of(5, 9, [("qty", "desc")]), "b")
    assert len(served.views) == 1  # one view per sort order, shared
    tables.unsubscribe("t", a)
    assert len(served.views) == 1
    tables.unsubscribe("t", b)
    assert not served.views and not served.by_id
