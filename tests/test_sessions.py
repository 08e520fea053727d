"""Session windows (`windowby(time, window=session(max_gap=...), instance=...)`):

* Pathway's own update stream of a bridging row merging two sessions, as Pathway 0.33.0
  printed it (docs/design/event-time-research.md, section "session"), at batch sizes 1 and all;
* random transactions (inserts, updates, deletes, times out of order and null) against DuckDB
  recomputing every session from scratch after every transaction, numeric and timestamp time
  columns, with and without an instance, at batch sizes 1, 7 and all and parallelism 1 and 2;
* the same random transactions through Pathway 0.33 itself: the same update streams;
* definition errors that name what to fix.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import random_transactions
from support.pathway_peer import windows_streams
from support.pathway_streams import in_stream_order
from test_windows import NUMBERS, STAMPS, _in_batches, _stream, check_window_reduces

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.engine import Engine

ROWS = TableSchema.of({"id": "bigint", "t": "bigint", "v": "bigint"}, primary_key=["id"])


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (None, 2)])
def test_pathways_bridging_row_merges_two_sessions(spark: SparkSession, size: int | None,
                                                   parallelism: int) -> None:
    """max_gap=3; rows t=1, 5, 3, 20 at transactions 1-4 (Pathway times 2, 4, 6, 8): t=3 is
    within 3 of both sessions, which it merges in its transaction."""
    p = Pipeline()
    rows = p.source("s", ROWS)
    p.output("o", rows.windowby("t", window=t.session(max_gap=3))
             .reduce(n=r.count(), s=r.sum("v")))
    changes = [((1, 1, 1), 1, 1), ((2, 5, 2), 2, 1), ((3, 3, 4), 3, 1), ((4, 20, 8), 4, 1)]
    # window_start | window_end | n | s | transaction | diff, as Pathway printed it.
    assert _stream(spark, p, _in_batches(changes, size), parallelism=parallelism) == \
        in_stream_order([
            (1, 1, 1, 1, 1, 1),
            (5, 5, 1, 2, 2, 1),
            (1, 1, 1, 1, 3, -1), (5, 5, 1, 2, 3, -1), (1, 5, 3, 7, 3, 1),
            (20, 20, 1, 8, 4, 1),
        ])


def test_a_deletion_splits_a_session_and_a_gap_of_max_gap_separates(spark: SparkSession
                                                                    ) -> None:
    p = Pipeline()
    rows = p.source("s", ROWS)
    p.output("o", rows.windowby("t", window=t.session(max_gap=3)).reduce(n=r.count()))
    changes = [((1, 1, 0), 1, 1), ((2, 3, 0), 1, 1), ((3, 5, 0), 1, 1), ((4, 8, 0), 1, 1),
               ((2, 3, 0), 2, -1)]
    # 1, 3, 5 are one session (gaps 2 < 3); 8 is 3 after 5, so a session of its own; deleting
    # 3 leaves a gap of 4 between 1 and 5.
    assert _stream(spark, p, _in_batches(changes, None)) == in_stream_order([
        (1, 5, 3, 1, 1), (8, 8, 1, 1, 1),
        (1, 1, 1, 2, 1), (1, 5, 3, 2, -1), (5, 5, 1, 2, 1),
    ])


# --- against DuckDB ----------------------------------------------------------------------------

def _duck_sessions(source: str, gap: int | timedelta, instance: bool) -> str:
    """The sessions recomputed by DuckDB: the instance's distinct times in order, a new session
    where the gap to the previous one is at least `gap`; each row then in the session whose
    [first, last] holds its time."""
    at, n = ("epoch_us(ts)", gap // timedelta(microseconds=1)) if isinstance(gap, timedelta) \
        else ("ts", gap)
    part = "PARTITION BY user_id" if instance else ""
    user = "user_id, " if instance else ""
    times = (f"SELECT DISTINCT {user}ts FROM \"{source}\" WHERE ts IS NOT NULL")
    cut = (f"SELECT *, SUM(CASE WHEN prev IS NULL OR {at} - prev >= {n} THEN 1 ELSE 0 END) "
           f"OVER ({part} ORDER BY ts ROWS UNBOUNDED PRECEDING) AS sid FROM (SELECT *, "
           f"LAG({at}) OVER ({part} ORDER BY ts) AS prev FROM ({times}))")
    bounds = (f"SELECT {user}sid, MIN(ts) AS ws, MAX(ts) AS we FROM ({cut}) "
              f"GROUP BY {user}sid")
    joined = (f"SELECT b.ws, b.we, e.* FROM \"{source}\" e JOIN ({bounds}) b "
              f"ON e.ts BETWEEN b.ws AND b.we" + (" AND e.user_id = b.user_id" if instance
                                                  else ""))
    return (f"SELECT {user}ws AS window_start, we AS window_end, COUNT(*) AS n, "
            f"CAST(SUM(v) AS BIGINT) AS s FROM ({joined}) GROUP BY {user}ws, we")


SESSIONS = [
    (NUMBERS, 3, True),
    (NUMBERS, 4, False),
    (STAMPS, timedelta(seconds=30), True),
    (STAMPS, timedelta(seconds=40), False),
]


@pytest.mark.parametrize(("seed", "sizes", "parallelism"),
                         [(1, (1, 7, 0), 1), (2, (7, 0), 2)])
def test_sessions_against_duckdb_at_every_batch_size(spark: SparkSession, seed: int,
                                                     sizes: tuple[int, ...], parallelism: int
                                                     ) -> None:
    check_window_reduces(spark, [(spec, t.session(max_gap=gap), instance,
                                  _duck_sessions(spec.name, gap, instance))
                                 for spec, gap, instance in SESSIONS],
                         seed, sizes, parallelism)


# --- Pathway itself on the same changes --------------------------------------------------------

@pytest.mark.parametrize(("seed", "size", "parallelism"), [(21, 1, 1), (22, 7, 2)])
def test_sessions_give_pathways_update_streams(spark: SparkSession, tmp_path: Path, seed: int,
                                               size: int, parallelism: int) -> None:
    transactions = random_transactions(random.Random(seed), (NUMBERS,), 30)
    changes = [(row, number, diff) for number, tx in enumerate(transactions, 1)
               for row, diff in tx.get(NUMBERS.name, [])]
    peers = {"by_user": (3, True), "whole": (2, False)}
    p = Pipeline()
    events = p.source("s", NUMBERS.schema)
    for name, (gap, instance) in peers.items():
        p.output(name, events.windowby("ts", window=t.session(max_gap=gap),
                                       instance="user_id" if instance else ())
                 .reduce(n=r.count(), s=r.sum("v")))
    want = windows_streams(
        [(*row, number, diff) for row, number, diff in changes],
        {name: {"kind": "session", "max_gap": gap, "instance": instance}
         for name, (gap, instance) in peers.items()}, tmp_path)
    for name in peers:
        assert any(row[-1] < 0 for row in want[name]), f"{name}: Pathway retracted nothing"
        got = _stream(spark, p, _in_batches(changes, size), output=name,
                      parallelism=parallelism)
        assert got == [tuple(row) for row in want[name]], f"{name}: seed {seed}"


# --- definition errors -------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "says"), [
    (lambda: t.session(max_gap=0), "must be positive"),
    (lambda: t.session(max_gap="5 minutes"), "must be a timedelta"),
])
def test_a_session_that_cannot_be_says_why(make: Callable[[], t.Session], says: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=says):
        make()


@pytest.mark.parametrize(("schema", "gap", "says"), [
    (ROWS, timedelta(seconds=1), "a timedelta gap for a timestamp column"),
    (TableSchema.of({"id": "bigint", "t": "timestamp"}, primary_key=["id"]), 5,
     "a timedelta gap for a timestamp column"),
    (TableSchema.of({"id": "bigint", "t": "text"}, primary_key=["id"]), 5,
     "sessions need a timestamp or a number"),
    (TableSchema.of({"id": "bigint", "t": "bigint", "window_start": "bigint"},
                    primary_key=["id"]), 5, "window_start already in its input"),
])
def test_session_errors_at_compile_name_the_table(spark: SparkSession, schema: TableSchema,
                                                  gap: int | timedelta, says: str) -> None:
    p = Pipeline()
    p.output("o", p.source("s", schema).windowby("t", window=t.session(max_gap=gap))
             .reduce(n=r.count()))
    with pytest.raises(PipelineDefinitionError, match=says) as raised:
        Engine(p, spark)
    assert "session(max_gap=" in str(raised.value), "the message names the windowed table"
