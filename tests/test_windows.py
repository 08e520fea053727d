"""Event-time windows (`Table.windowby`, `txstream.temporal`): tumbling and sliding windows as
group keys, without temporal behaviors.

* Pathway's own update streams, ported exactly: the sliding windows of its tutorial
  "windows_temporal_behavior" without a behavior, and a tumbling window with a deletion, one
  Pathway time per transaction (`__time__` in order -> transactions 1, 2, ...), as Pathway
  0.33.0 printed them;
* random transactions (updates and deletions, event times on both sides of the origin, out of
  order) against DuckDB recomputing every window from scratch after every transaction, with
  numeric and timestamp time columns, overlapping windows, windows with gaps between them and
  an explicit origin, at batch sizes 1, 7 and all and at parallelism 1 and 2;
* the same random transactions through Pathway 0.33 itself (`tests/support/pathway_peer.py`,
  its own virtualenv), one Pathway time per transaction: the same update streams;
* definition errors that name what to fix.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support import pathway_streams as printed
from support.engine_oracle import (
    Columns,
    RandomSource,
    check_at_every_size,
    random_transactions,
)
from support.pathway_peer import windows_streams

from txstream import Pipeline, PipelineDefinitionError, Table, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine

LOGS = TableSchema.of({"id": "bigint", "event_time": "bigint"}, primary_key=["id"])


def _stream(spark: SparkSession, pipeline: Pipeline, batches: list[list[tuple[tuple, int, int]]],
            output: str = "o", parallelism: int = 1) -> list[tuple]:
    """The output's changes as (*row, time, diff), sorted, over `batches` of the source `s`'s
    (row, time, diff) changes."""
    engine = Engine(pipeline, spark, parallelism=parallelism)
    schema = pipeline.sources["s"].schema
    assert schema is not None
    got = []
    for batch in batches:
        data = {n: [row[i] for row, _, _ in batch] for i, n in enumerate(schema.names)}
        data |= {TIME: [time for _, time, _ in batch], DIFF: [diff for _, _, diff in batch]}
        changes = Changes(pa.table(data, schema=schema.arrow_schema(with_changes=True)))
        got += [tuple(row.values()) for row in engine.process({"s": changes})[output]
                .table.to_pylist()]
    return printed.in_stream_order(got)


def _in_batches(changes: list[tuple[tuple, int, int]], size: int | None
                ) -> list[list[tuple[tuple, int, int]]]:
    """`changes` (ordered by time) in batches of `size` transactions (None: one batch)."""
    times = sorted({time for _, time, _ in changes})
    size = size or len(times)
    groups = [set(times[i:i + size]) for i in range(0, len(times), size)]
    return [[c for c in changes if c[1] in group] for group in groups]


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (3, 2)])
def test_pathways_sliding_windows_without_a_behavior(spark: SparkSession, size: int | None,
                                                     parallelism: int) -> None:
    p = Pipeline()
    logs = p.source("s", LOGS)
    p.output("o", logs.windowby("event_time", window=t.sliding(hop=4, duration=10))
             .reduce(n_logs=r.count()))
    changes = [((i, event), printed.TUTORIAL_TIMES.index(arrived) + 1, 1)
               for i, (event, arrived) in enumerate(printed.TUTORIAL)]
    changes.sort(key=lambda c: c[1])
    assert _stream(spark, p, _in_batches(changes, size), parallelism=parallelism) == \
        printed.parse(printed.TUTORIAL_STREAMS["no behavior"], printed.TUTORIAL_TIMES)


@pytest.mark.parametrize("size", [1, None])
def test_pathways_tumbling_window_with_a_deletion(spark: SparkSession, size: int | None) -> None:
    p = Pipeline()
    rows = p.source("s", TableSchema.of({"id": "bigint", "t": "bigint", "v": "bigint"},
                                        primary_key=["id"]))
    p.output("o", rows.windowby("t", window=t.tumbling(10)).reduce(n=r.count(), s=r.sum("v")))
    changes = [(row, printed.TUMBLING_TIMES.index(time) + 1, diff)
               for row, time, diff in printed.TUMBLING_ROWS]
    assert _stream(spark, p, _in_batches(changes, size)) == \
        printed.parse(printed.TUMBLING_STREAMS["no behavior"], printed.TUMBLING_TIMES)


# --- against DuckDB ----------------------------------------------------------------------------

NUMBERS = RandomSource(
    "events", TableSchema.of({"id": "bigint", "user_id": "bigint", "ts": "bigint",
                              "v": "bigint"}, primary_key=["id"]),
    {"id": range(12), "user_id": (1, 2, 3), "ts": range(-13, 30), "v": (1, 5, 10, -3)})
DAY = datetime(2026, 12, 6, tzinfo=UTC)
STAMPS = RandomSource(
    "clicks", TableSchema.of({"id": "bigint", "user_id": "bigint", "ts": "timestamp",
                              "v": "bigint"}, primary_key=["id"]),
    {"id": range(12), "user_id": (1, 2),
     "ts": [DAY + timedelta(seconds=s) for s in range(-200, 400, 17)] + [None],
     "v": (1, 5, 10)})


def _duck_windows(source: str, window: t.Sliding, instance: bool) -> str:
    """The windowed reduce recomputed by DuckDB: every window start `origin + k * hop` near the
    row's time, kept when it holds the time (a formula of its own, not the engine's)."""
    hop, duration = window.hop, window.duration
    timed = isinstance(hop, timedelta)
    if timed:
        assert isinstance(duration, timedelta)
        micros = timedelta(microseconds=1)
        hop_n, duration_n = hop // micros, duration // micros
        origin = window.origin if window.origin is not None else datetime(1973, 1, 1, tzinfo=UTC)
        assert isinstance(origin, datetime)
        origin_n = (origin - datetime(1970, 1, 1, tzinfo=UTC)) // micros
        at = "epoch_us(ts)"
        bound = "make_timestamp({})::TIMESTAMPTZ"
    else:
        assert not isinstance(duration, timedelta)
        hop_n, duration_n = hop, duration
        origin_n = window.origin if window.origin is not None else 0
        at, bound = "ts", "{}"
    span = math.ceil(duration_n / hop_n) + 1
    k = f"CAST(floor(({at} - {origin_n})::DOUBLE / {hop_n}) AS BIGINT)"
    starts = (f"SELECT *, {origin_n} + k * {hop_n} AS ws FROM (SELECT *, unnest(range({k} - "
              f"{span}, {k} + 2)) AS k FROM \"{source}\" WHERE ts IS NOT NULL)")
    held = f"ws <= {at} AND {at} < ws + {duration_n}"
    if window.origin is not None:
        held += f" AND ws >= {origin_n}"
    user = "user_id, " if instance else ""
    return (f"SELECT {user}{bound.format('ws')} AS window_start, "
            f"{bound.format(f'ws + {duration_n}')} AS window_end, COUNT(*) AS n, "
            f"CAST(SUM(v) AS BIGINT) AS s FROM ({starts}) WHERE {held} "
            f"GROUP BY {user}ws")


WINDOWS: list[tuple[RandomSource, t.Sliding, bool]] = [
    (NUMBERS, t.tumbling(5), True),
    (NUMBERS, t.sliding(hop=3, duration=7), False),
    (NUMBERS, t.sliding(hop=5, duration=3), True),  # gaps between windows
    (NUMBERS, t.tumbling(4, origin=3), False),  # windows before the origin dropped
    (STAMPS, t.tumbling(timedelta(minutes=1)), True),
    (STAMPS, t.sliding(hop=timedelta(seconds=40), duration=timedelta(minutes=2),
                       origin=DAY - timedelta(seconds=30)), True),
]


def check_window_reduces(spark: SparkSession,
                         cases: Sequence[tuple[RandomSource, t.Sliding | t.Session, bool, str]],
                         seed: int, sizes: tuple[int, ...], parallelism: int) -> None:
    """Each case (source, window, per user or not, DuckDB's SQL of the result) as a windowed
    count and sum of `v`, over 25 random transactions of NUMBERS and STAMPS, against DuckDB
    after every transaction at each batch size (`check_at_every_size`)."""
    p = Pipeline()
    sources = {spec.name: p.source(spec.name, spec.schema) for spec in (NUMBERS, STAMPS)}
    outputs: dict[str, Columns] = {}
    views = []
    for i, (spec, window, instance, sql) in enumerate(cases):
        name = f"w{i}"
        grouped = sources[spec.name].windowby("ts", window=window,
                                              instance="user_id" if instance else ())
        p.output(name, grouped.reduce(n=r.count(), s=r.sum("v")))
        kind = "timestamp" if window.timed else "bigint"
        outputs[name] = ((("user_id", "bigint"),) if instance else ()) + (
            ("window_start", kind), ("window_end", kind), ("n", "bigint"), ("s", "bigint"))
        views.append((name, sql))
    transactions = random_transactions(random.Random(seed), (NUMBERS, STAMPS), 25)

    def describe(name: str) -> str:
        spec, window, instance, _ = cases[int(name[1:])]
        return f"seed {seed}: {spec.name}.windowby('ts', window={window.describe()}, " \
               f"instance={'user_id' if instance else ()})"

    check_at_every_size(spark, p, (NUMBERS, STAMPS), outputs, tuple(views), transactions,
                        sizes, describe, parallelism)


@pytest.mark.parametrize(("seed", "sizes", "parallelism"),
                         [(1, (1, 7, 0), 1), (2, (7, 0), 2), (3, (1, 0), 2)])
def test_windows_against_duckdb_at_every_batch_size(spark: SparkSession, seed: int,
                                                    sizes: tuple[int, ...], parallelism: int
                                                    ) -> None:
    check_window_reduces(spark, [(spec, window, instance,
                                  _duck_windows(spec.name, window, instance))
                                 for spec, window, instance in WINDOWS],
                         seed, sizes, parallelism)


# --- definition errors -------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "says"), [
    (lambda: t.sliding(hop=1, duration=timedelta(minutes=1)), "both timedelta"),
    (lambda: t.tumbling(0), "must be positive"),
    (lambda: t.tumbling(timedelta(0)), "must be positive"),
    (lambda: t.tumbling("1 minute"), "must be timedelta or numbers"),
    (lambda: t.tumbling(10, origin=DAY), "a datetime with timedelta lengths"),
    (lambda: t.tumbling(timedelta(seconds=1), origin=0), "a datetime with timedelta lengths"),
])
def test_a_window_that_cannot_be_says_why(make: Callable[[], t.Sliding], says: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=says):
        make()


def _windowed(build: Callable[[Table], Table]) -> Pipeline:
    """A pipeline whose output `o` is `build` of a source with a column named `window_end`."""
    p = Pipeline()
    p.output("o", build(p.source("s", TableSchema.of(
        {"id": "bigint", "window_end": "bigint", "ts": "timestamp"}, primary_key=["id"]))))
    return p


def test_windowby_refuses_what_is_not_a_window() -> None:
    with pytest.raises(PipelineDefinitionError, match="is not a window"):
        _windowed(lambda s: s.windowby("ts", window=timedelta(minutes=1))  # type: ignore[arg-type]
                  .reduce(n=r.count()))


@pytest.mark.parametrize(("build", "says"), [
    (lambda s: s.windowby("ts", window=t.tumbling(timedelta(minutes=1))).reduce(n=r.count()),
     "window_end already in its input; rename"),
    (lambda s: s.select("id", t="ts").windowby("t", window=t.tumbling(5)).reduce(n=r.count()),
     "unix_micros|pmod|data type"),
])
def test_windowby_errors_at_compile_name_the_table(spark: SparkSession,
                                                   build: Callable[[Table], Table],
                                                   says: str) -> None:
    pipeline = _windowed(build)
    with pytest.raises(PipelineDefinitionError, match=says) as raised:
        Engine(pipeline, spark)
    assert "windows of" in str(raised.value), "the message names the windowed table"


def test_window_bounds_are_whole_hops_from_the_origin() -> None:
    w = t.sliding(hop=3, duration=7)
    assert w.windows_per_row == 3
    assert t.sliding(hop=5, duration=3).windows_per_row == 1
    assert t.tumbling(timedelta(minutes=1)).describe() == "tumbling(0:01:00)"
    assert t.tumbling(4, origin=2).describe() == "tumbling(4, origin=2)"


# --- Pathway itself on the same changes --------------------------------------------------------

PEER_WINDOWS: dict[str, tuple[t.Sliding, bool]] = {
    "tumbling": (t.tumbling(5), True),
    "sliding": (t.sliding(hop=3, duration=7), False),
    "gaps": (t.sliding(hop=5, duration=3), True),
    "origin": (t.tumbling(4, origin=3), True),
}


@pytest.mark.parametrize(("seed", "size", "parallelism"), [(11, 1, 1), (12, 7, 2)])
def test_windows_give_pathways_update_streams(spark: SparkSession, tmp_path: Path, seed: int,
                                              size: int, parallelism: int) -> None:
    """Random transactions (inserts, updates, deletes, times out of order and below the origin)
    through Pathway 0.33's windowby in its own virtualenv, one Pathway time per transaction,
    and through txstream in batches: the same diffs at the same transactions."""
    transactions = random_transactions(random.Random(seed), (NUMBERS,), 30)
    changes = [(row, number, diff) for number, tx in enumerate(transactions, 1)
               for row, diff in tx.get(NUMBERS.name, [])]
    p = Pipeline()
    events = p.source("s", NUMBERS.schema)
    for name, (window, instance) in PEER_WINDOWS.items():
        p.output(name, events.windowby("ts", window=window,
                                       instance="user_id" if instance else ())
                 .reduce(n=r.count(), s=r.sum("v")))
    want = windows_streams(
        [(*row, number, diff) for row, number, diff in changes],
        {name: {"kind": "tumbling" if window.hop == window.duration else "sliding",
                "hop": window.hop, "duration": window.duration, "origin": window.origin,
                "instance": instance} for name, (window, instance) in PEER_WINDOWS.items()},
        tmp_path)
    for name in PEER_WINDOWS:
        assert any(row[-1] < 0 for row in want[name]), f"{name}: Pathway retracted nothing"
        got = _stream(spark, p, _in_batches(changes, size), output=name,
                      parallelism=parallelism)
        assert got == [tuple(row) for row in want[name]], f"{name}: seed {seed}"
