"""`txstream.examples.windows`, the pipeline bench/temporal_end_to_end.py runs as a service:
per-user counts in one-minute windows over numeric times (microseconds), each window shown
once, in the transaction whose views move the clock to its end; a view whose window had closed
before its transaction is late, counted and left out."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession

from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine
from txstream.examples.windows import MINUTE_US, VIEWS, pipeline

S = 1_000_000  # a second, in the views' unit


def _views(time: int, *views: tuple[int, int]) -> Changes:
    users, ts = zip(*views, strict=True)
    return Changes(pa.table({"user_id": list(users), "ts": list(ts), TIME: [time] * len(views),
                             DIFF: [1] * len(views)},
                            schema=VIEWS.arrow_schema(with_changes=True)))


def _shown(engine: Engine, changes: Changes) -> list[tuple[int, ...]]:
    out = engine.process({"views": changes})["per_window"].table
    return sorted(zip(*(out[c].to_pylist() for c in ("user_id", "window_start", "window_end",
                                                       "views", TIME, DIFF)), strict=True))


def test_each_window_is_shown_once_when_the_clock_passes_its_end(spark: SparkSession) -> None:
    engine = Engine(pipeline(), spark)
    # The clock reaches 70 s: user 1's first minute closes, user 2's second is still open.
    assert _shown(engine, _views(1, (1, 0), (1, 10 * S), (2, 70 * S))) == [
        (1, 0, MINUTE_US, 2, 1, 1)]
    # A view of user 1's closed minute is late; user 2's minute closes at 130 s.
    assert _shown(engine, _views(2, (1, 5 * S), (2, 130 * S))) == [
        (2, MINUTE_US, 2 * MINUTE_US, 1, 2, 1)]
    assert sum(engine.late_rows.values()) == 1
