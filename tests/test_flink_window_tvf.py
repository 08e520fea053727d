"""Flink's window TVF documentation (`docs/dev/table/sql/queries/window-tvf.md`, the `Bid`
table) ported with its exact results: TUMBLE, HOP and TUMBLE with an offset (an explicit
origin here), a bid per transaction in bid time order. Flink shows each window once, when the
watermark passes its end; without a behavior txstream's windows integrate to Flink's table, and
under `exactly_once_behavior()` a window is shown once, when a later bid moves the clock past
its end (the last one waits for a bid after it, as Flink's waits for its watermark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine

BID = TableSchema.of({"bidtime": "timestamp", "price": "decimal(10,2)", "item": "text"})
BIDS = [("08:05", "4.00", "C"), ("08:07", "2.00", "A"), ("08:09", "5.00", "D"),
        ("08:11", "3.00", "B"), ("08:13", "1.00", "E"), ("08:17", "6.00", "F")]
MINUTE = timedelta(minutes=1)


def _at(clock: str) -> datetime:
    hours, minutes = map(int, clock.split(":"))
    return datetime(2020, 4, 15, hours, minutes, tzinfo=UTC)


def _windows(spark: SparkSession, window: t.Sliding, behavior: t.Behavior | None = None
             ) -> list[tuple[str, str, Decimal, int, int]]:
    """(window_start, window_end, SUM(price), transaction, diff) of the bids, one per
    transaction."""
    p = Pipeline()
    p.output("o", p.source("bid", BID).windowby("bidtime", window=window, behavior=behavior)
             .reduce(price=r.sum("price")))
    engine = Engine(p, spark)
    got = []
    for number, (clock, price, item) in enumerate(BIDS, 1):
        changes = Changes(pa.table({"bidtime": [_at(clock)], "price": [Decimal(price)],
                                    "item": [item], TIME: [number], DIFF: [1]},
                                   schema=BID.arrow_schema(with_changes=True)))
        got += [(row["window_start"].strftime("%H:%M"), row["window_end"].strftime("%H:%M"),
                 row["price"], row[TIME], row[DIFF])
                for row in engine.process({"bid": changes})["o"].table.to_pylist()]
    return got


def _integrated(changes: list[tuple[str, str, Decimal, int, int]]
                ) -> list[tuple[str, str, Decimal]]:
    total: dict[tuple[str, str, Decimal], int] = {}
    for start, end, price, _, diff in changes:
        total[(start, end, price)] = total.get((start, end, price), 0) + diff
    return sorted(row for row, n in total.items() if n)


@pytest.mark.parametrize(("window", "table"), [
    (t.tumbling(10 * MINUTE), [("08:00", "08:10", "11.00"), ("08:10", "08:20", "10.00")]),
    (t.sliding(hop=5 * MINUTE, duration=10 * MINUTE),
     [("08:00", "08:10", "11.00"), ("08:05", "08:15", "15.00"), ("08:10", "08:20", "10.00"),
      ("08:15", "08:25", "6.00")]),
    (t.tumbling(10 * MINUTE, origin=_at("08:01")),
     [("08:01", "08:11", "11.00"), ("08:11", "08:21", "10.00")]),
], ids=["TUMBLE", "HOP", "TUMBLE with offset"])
def test_flinks_bid_windows(spark: SparkSession, window: t.Sliding,
                            table: list[tuple[str, str, str]]) -> None:
    assert _integrated(_windows(spark, window)) == [(s, e, Decimal(p)) for s, e, p in table]


def test_flinks_tumble_exactly_once(spark: SparkSession) -> None:
    """[08:00, 08:10) shown once, by the bid at 08:11 (transaction 4); [08:10, 08:20) not yet:
    no bid has come after it."""
    got = _windows(spark, t.tumbling(10 * MINUTE), t.exactly_once_behavior())
    assert got == [("08:00", "08:10", Decimal("11.00"), 4, 1)]
