"""Filters that call now() (`txstream.engine.operators.now_filter`): rows enter and leave as the
transactions' wall time moves.

* a "last 10 minutes" filter step by step, tick transactions (no changes) included, and rows
  whose time is in the future entering when now() reaches them;
* random transactions (inserts, updates, deletes, wall times that sometimes step back, ticks)
  against a from-scratch recompute in Python after every transaction, at batch sizes 1, 3 and
  all and parallelism 1 and 2;
* bounded state: rows past an upper bound leave it; a lower bound alone keeps every row;
* definition and input errors that say what to fix.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support.pathway_streams import in_stream_order

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine
from txstream.engine.errors import EngineInputError
from txstream.service.replay import ReplayInputError, replay

VIEWS = TableSchema.of({"id": "bigint", "ts": "timestamp", "v": "bigint"}, primary_key=["id"])
T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
Change = tuple[tuple, int, int]  # (row, transaction, diff)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _run(spark: SparkSession, pipeline: Pipeline, changes: list[Change],
         walls: dict[int, datetime], size: int | None, parallelism: int = 1
         ) -> tuple[list[tuple], Engine]:
    """The output `o`'s changes (*row, transaction, diff) in stream order over `changes`, each
    transaction with its wall time in `walls` (those without changes are ticks), in batches of
    `size` transactions (None: one batch)."""
    engine = Engine(pipeline, spark, parallelism=parallelism)
    numbers = sorted(walls)
    size = size or len(numbers)
    got = []
    for i in range(0, len(numbers), size):
        batch = numbers[i:i + size]
        rows = [c for c in changes if c[1] in batch]
        data = {n: [row[j] for row, _, _ in rows] for j, n in enumerate(VIEWS.names)}
        data |= {TIME: [t for _, t, _ in rows], DIFF: [d for _, _, d in rows]}
        given = Changes(pa.table(data, schema=VIEWS.arrow_schema(with_changes=True)))
        out = engine.process({"views": given}, wall_times={n: walls[n] for n in batch})["o"]
        got += [tuple(r.values()) for r in out.table.to_pylist()]
    return in_stream_order(got), engine


def _last_ten_minutes() -> Pipeline:
    p = Pipeline()
    views = p.source("views", VIEWS)
    p.output("o", views.filter("ts >= now() - INTERVAL 10 MINUTES AND ts <= now() AND v > 0"))
    return p


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (2, 2)])
def test_rows_enter_and_leave_as_the_wall_time_moves(spark: SparkSession, size: int | None,
                                                     parallelism: int) -> None:
    changes = [
        ((1, _at(0), 1), 1, 1),          # in from transaction 1 until now() passes 10:00
        ((2, _at(300), 1), 1, 1),        # in the future at 1: enters at 3 (now() = 5:00)
        ((3, _at(60), 0), 2, 1),         # v = 0: never
        ((1, _at(0), 1), 4, -1),         # deleted after it left: no change
        ((4, _at(500), 1), 5, 1),        # in at 5; leaves at 7 (now() 18:40 > 8:20 + 10:00)
    ]
    walls = {1: _at(30), 2: _at(200), 3: _at(300), 4: _at(601), 5: _at(700),
             6: _at(650),  # a wall time that steps back: now() stays at 11:40
             7: _at(1120)}
    got, _ = _run(spark, _last_ten_minutes(), changes, walls, size, parallelism)
    assert got == in_stream_order([
        (1, _at(0), 1, 1, 1),
        (2, _at(300), 1, 3, 1),
        (1, _at(0), 1, 4, -1),           # 601 s: row 1's time is more than 10 minutes back
        (4, _at(500), 1, 5, 1),
        (2, _at(300), 1, 7, -1),         # 18:40: rows 2 and 4 are more than 10 minutes back
        (4, _at(500), 1, 7, -1),
    ])


def test_rows_that_can_never_pass_leave_the_state(spark: SparkSession) -> None:
    changes = [((i, _at(10 * i), 1), 1, 1) for i in range(20)]
    walls = {1: _at(200), 2: _at(5000)}
    _, bounded = _run(spark, _last_ten_minutes(), changes, walls, 1)
    rows = {name: n for name, n in bounded.state_rows().items() if name.endswith("-rows")}
    assert list(rows.values()) == [0], f"every row is more than 10 minutes old: {rows}"

    p = Pipeline()
    p.output("o", p.source("views", VIEWS).filter("now() >= ts"))
    _, unbounded = _run(spark, p, changes, walls, 1)
    rows = {name: n for name, n in unbounded.state_rows().items() if name.endswith("-rows")}
    assert list(rows.values()) == [20], "with a lower bound only, a row may be deleted later"

    p = Pipeline()
    p.output("o", p.source("views", VIEWS).filter("now() >= ts AND v > 1"))
    _, filtered = _run(spark, p, changes, walls, 1)
    rows = {name: n for name, n in filtered.state_rows().items() if name.endswith("-rows")}
    assert list(rows.values()) == [0], "a row failing a conjunct without now() never passes"


# --- random transactions against a recompute ----------------------------------------------------

PREDICATES = {
    "window": ("ts >= now() - INTERVAL 40 SECONDS AND ts < now() + INTERVAL 10 SECONDS "
               "AND v <> 2",
               lambda ts, v, now: now - timedelta(seconds=40) <= ts < now + timedelta(seconds=10)
               and v != 2),
    "since": ("now() >= ts", lambda ts, v, now: now >= ts),
    "until": ("ts + INTERVAL 30 SECONDS > now()",
              lambda ts, v, now: ts + timedelta(seconds=30) > now),
}


def _random(seed: int) -> tuple[list[Change], dict[int, datetime]]:
    """Keyed changes over 40 transactions, some of them ticks, with wall times mostly rising
    by up to 20 s and sometimes stepping back; event times around the wall time, or null."""
    rng = random.Random(seed)
    live: dict[int, tuple] = {}
    changes: list[Change] = []
    walls: dict[int, datetime] = {}
    wall = 0.0
    for number in range(1, 41):
        wall += rng.choice((-15, 0, 5, 10, 20))
        walls[number] = _at(wall)
        if rng.random() < 0.25:
            continue  # a tick
        for key in rng.sample(range(10), rng.randint(1, 3)):
            new = (key, rng.choice([_at(wall + rng.randint(-60, 30)), None]), rng.randint(1, 3))
            old = live.pop(key, None)
            if old is not None:
                changes.append((old, number, -1))
            if old is None or rng.random() < 0.7:
                changes.append((new, number, 1))
                live[key] = new
    return changes, walls


def _recomputed(changes: list[Change], walls: dict[int, datetime],
                holds: Callable[[datetime, int, datetime], bool]) -> dict[int, Counter]:
    """The filter's output after each transaction, from scratch: now() the largest wall time
    so far."""
    rows: Counter = Counter()
    now: datetime | None = None
    expected = {}
    for number in sorted(walls):
        now = walls[number] if now is None else max(now, walls[number])
        for row, t, diff in changes:
            if t == number:
                rows[row] += diff
        expected[number] = Counter({row: n for row, n in rows.items()
                                    if n and row[1] is not None and holds(row[1], row[2], now)})
    return expected


@pytest.mark.parametrize(("seed", "sizes", "parallelism"),
                         [(1, (1, 3, None), 1), (2, (3, None), 2)])
def test_now_filters_against_a_recompute_after_every_transaction(
        spark: SparkSession, seed: int, sizes: tuple[int | None, ...], parallelism: int) -> None:
    changes, walls = _random(seed)
    for name, (predicate, holds) in PREDICATES.items():
        p = Pipeline()
        p.output("o", p.source("views", VIEWS).filter(predicate))
        expected = _recomputed(changes, walls, holds)
        streams = []
        for size in sizes:
            got, _ = _run(spark, p, changes, walls, size, parallelism)
            integrated: Counter = Counter()
            for number in sorted(walls):
                for *row, t, diff in got:
                    if t == number:
                        integrated[tuple(row)] += diff
                now = +integrated
                assert now == expected[number], (
                    f"{name} ({predicate}), seed {seed}, batches of {size or 'all'}: after "
                    f"transaction {number} (wall {walls[number]}) got {sorted(now.items())}, "
                    f"want {sorted(expected[number].items())}")
            streams.append(got)
        assert all(s == streams[0] for s in streams), f"{name}: streams differ by batch size"
        assert any(row[-1] < 0 for row in streams[0]), f"{name}: no row ever left"


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("predicate", [
    "date(ts) = date(now())",
    "ts BETWEEN now() - INTERVAL 1 HOUR AND now()",
    "ts >= now() * 2",
    "now() - ts > INTERVAL 1 HOUR",
])
def test_now_must_be_compared_directly(spark: SparkSession, predicate: str) -> None:
    p = Pipeline()
    p.output("o", p.source("views", VIEWS).filter(predicate))
    with pytest.raises(PipelineDefinitionError, match="now\\(\\) must be compared directly"):
        Engine(p, spark)


def test_now_in_a_select_points_at_filters(spark: SparkSession) -> None:
    p = Pipeline()
    p.output("o", p.source("views", VIEWS).select("id", seen="now()"))
    with pytest.raises(PipelineDefinitionError,
                       match="compare a column with now\\(\\) in a filter"):
        Engine(p, spark)


def test_a_transaction_without_its_wall_time_is_refused(spark: SparkSession) -> None:
    engine = Engine(_last_ten_minutes(), spark)
    changes = Changes(pa.table({"id": [1], "ts": [_at(0)], "v": [1], TIME: [1], DIFF: [1]},
                               schema=VIEWS.arrow_schema(with_changes=True)))
    with pytest.raises(EngineInputError, match="none given for transaction\\(s\\) 1"):
        engine.process({"views": changes})
    with pytest.raises(EngineInputError, match="no time zone"):
        engine.process({"views": changes}, wall_times={1: datetime(2026, 12, 6)})


def test_a_source_may_not_take_the_clocks_name() -> None:
    with pytest.raises(PipelineDefinitionError, match="names starting with '__'"):
        Pipeline().source("__now", VIEWS)


# --- txstream replay ---------------------------------------------------------------------------

def _log(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("batch", [1, 100])
def test_replay_takes_wall_times_and_ticks(spark: SparkSession, tmp_path: Path, batch: int
                                           ) -> None:
    # A timestamp column's value in a change log is epoch microseconds.
    row = {"id": 1, "ts": int(T0.timestamp() * 1_000_000), "v": 1}
    given = _log(tmp_path / "in.jsonl", [
        {"source": "views", "time": 1, "diff": 1, "row": row,
         "wall_time": "2026-12-06T12:01:00Z"},
        {"time": 2, "wall_time": "2026-12-06T12:09:00Z"},   # a tick: still within 10 minutes
        {"time": 3, "wall_time": "2026-12-06T12:10:01Z"},   # a tick: the row leaves
    ])
    out = tmp_path / "out.jsonl"
    assert replay(_last_ten_minutes(), spark, given, out, batch_transactions=batch) == 2
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(c["time"], c["diff"], c["row"]["id"]) for c in got] == [(1, 1, 1), (3, -1, 1)]


def test_replay_of_a_now_pipeline_needs_every_wall_time(spark: SparkSession, tmp_path: Path
                                                        ) -> None:
    given = _log(tmp_path / "in.jsonl", [
        {"source": "views", "time": 1, "diff": 1,
         "row": {"id": 1, "ts": int(T0.timestamp() * 1_000_000), "v": 1}},
    ])
    with pytest.raises(ReplayInputError, match="line 1: transaction 1 has no wall_time"):
        replay(_last_ten_minutes(), spark, given, tmp_path / "out.jsonl")
