"""Feldera's `StreamingTests.java` (sql-to-dbsp-compiler), ported step by step.

Feldera declares lateness on a source column (`pickup TIMESTAMP LATENESS INTERVAL '1:00'`): a
row more than an hour behind the largest time seen before its step is dropped. The nearest
txstream meaning is a window's `common_behavior(cutoff=1 hour)`: a row is late when its window's
end plus the cutoff is at or below the clock before its transaction. For these tests' one-day
windows the two drop the same rows, so Feldera's expected outputs hold step by step (one
transaction per step), at every batch size and parallelism:

* `tumblingTest` (the same data as its `latenessTest`): the average distance per day, rows a
  day behind dropped, rows within the hour updating the average;
* `tumblingTestLimits`: 30-minute windows with an offset (`TIME '00:12:00'`, here the origin
  00:12 of that day), a row on a window's start in the window it starts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession
from support.pathway_streams import in_stream_order
from test_asof_join import _joined

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream import temporal as t

SERIES = TableSchema.of({"distance": "double", "pickup": "timestamp"})
LATENESS = t.common_behavior(cutoff=timedelta(hours=1))


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 2)])
def test_feldera_tumbling_with_lateness(spark: SparkSession, size: int | None,
                                        parallelism: int) -> None:
    p = Pipeline()
    days = p.source("series", SERIES).windowby("pickup", window=t.tumbling(timedelta(days=1)),
                                              behavior=LATENESS)
    p.output("v", days.reduce(avg=r.avg("distance")).select("avg", "window_start"))
    p.output("late", days.late_rows().select("distance", "pickup"))
    steps = [(10.0, "2023-12-30 10:00:00"),
             (10.0, "2023-12-29 10:00:00"),  # before the waterline: dropped
             (20.0, "2023-12-30 10:10:00"),  # after it: the average changes
             (10.0, "2023-12-29 09:10:00"),  # before the last waterline: dropped
             (10.0, "2023-12-30 10:00:00"),  # in the past, but not before the waterline
             # Feldera's last step reads "2023-13-30", a date that does not exist: the next day.
             (10.0, "2023-12-31 10:00:00")]
    sides = {"series": [((d, _at(ts)), n, 1) for n, (d, ts) in enumerate(steps, 1)]}
    day = _at("2023-12-30 00:00:00")
    assert _joined(spark, p, sides, size, parallelism, "v") == in_stream_order([
        (10.0, day, 1, 1),
        (10.0, day, 3, -1), (15.0, day, 3, 1),
        (15.0, day, 5, -1), (13.333333333333334, day, 5, 1),
        (10.0, _at("2023-12-31 00:00:00"), 6, 1),
    ])
    assert _joined(spark, p, sides, size, parallelism, "late") == in_stream_order([
        (10.0, _at("2023-12-29 10:00:00"), 2, 1), (10.0, _at("2023-12-29 09:10:00"), 4, 1)])


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 2)])
def test_feldera_tumbling_limits(spark: SparkSession, size: int | None,
                                 parallelism: int) -> None:
    p = Pipeline()
    windows = p.source("series", SERIES).windowby(
        "pickup", window=t.tumbling(timedelta(minutes=30), origin=_at("2024-02-08 00:12:00")),
        behavior=LATENESS)
    p.output("v", windows.reduce(n=r.count()).select("window_start", "window_end"))
    steps = ["2024-02-08 10:00:00", "2024-02-08 10:10:00",  # the same window
             "2024-02-08 10:12:00", "2024-02-08 10:30:00"]  # the next, from its start on
    sides = {"series": [((0.0, _at(ts)), n, 1) for n, ts in enumerate(steps, 1)]}
    assert _joined(spark, p, sides, size, parallelism, "v") == in_stream_order([
        (_at("2024-02-08 09:42:00"), _at("2024-02-08 10:12:00"), 1, 1),
        (_at("2024-02-08 10:12:00"), _at("2024-02-08 10:42:00"), 3, 1),
    ])
