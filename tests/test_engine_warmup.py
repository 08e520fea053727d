"""Warming an engine up with made-up rows (`txstream.engine.warmup`): it leaves no trace in what the
engine computes, and the first real batch reuses the plans it recorded."""

from __future__ import annotations

import random
import threading
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import process

from txstream.engine import Engine, EngineStateError, Pipeline
from txstream.engine import reducers as r
from txstream.engine.warmup import synthetic_changes, warm_up, warming_up
from txstream.examples.order_events import as_changes, events
from txstream.examples.orders import pipeline as orders_pipeline
from txstream.schemas.tables import TableSchema

EVERY_TYPE = TableSchema.of({"a": "bigint", "b": "int", "c": "double", "d": "text",
                             "e": "boolean", "f": "timestamp", "g": "date",
                             "h": "decimal(12,2)", "i": "decimal(3,3)"}, primary_key=["a"])


def test_synthetic_changes_fit_every_column_type() -> None:
    ids = np.arange(1_000, 1_500)
    table = synthetic_changes(EVERY_TYPE, ids, (6, 10), -1).validate().table
    assert table.schema == EVERY_TYPE.arrow_schema(with_changes=True)
    assert table.num_rows == 500 and table.column("a").to_pylist() == ids.tolist()
    assert table.column("d").to_pylist()[:2] == ["1000", "1001"]
    # Distinct rows, distinct values (within a decimal's digits), so joins match one to one.
    assert len(set(table.column("h").to_pylist())) == 500
    assert table.column("h").to_pylist()[:2] == [Decimal("10.00"), Decimal("10.01")]
    times = table.column("time")
    assert pc.min(times).as_py() == 6 and pc.max(times).as_py() == 10
    assert sorted(set(times.to_pylist())) == [6, 7, 8, 9, 10]
    assert set(table.column("diff").to_pylist()) == {-1}
    assert all(table.column(c).null_count == 0 for c in table.column_names)


def _stream(seed: int) -> list[dict[str, pa.Table]]:
    stream = events(random.Random(seed), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    return [as_changes([next(stream) for _ in range(size)], rows, time)
            for time, size in enumerate([2_000, 10, 10, 600], start=1)]


def test_a_warmed_up_engine_computes_what_a_fresh_one_does(spark: SparkSession) -> None:
    warmed = Engine(orders_pipeline(), spark)
    assert warm_up(warmed, 600) > 0
    assert all(not state.runs for state, _ in warmed.version().states.values())
    assert warmed.last_batch is None and warmed.totals.jobs == 0
    fresh = Engine(orders_pipeline(), spark)
    for i, batch in enumerate(_stream(3)):
        ours, theirs = process(warmed, batch), process(fresh, batch)
        assert ours.keys() == theirs.keys()
        assert all(ours[name].equals(theirs[name]) for name in ours), f"batch {i}"
        if i == 0:
            assert warmed.last_batch is not None and warmed.last_batch.rebound, \
                "the first real batch reuses the plans the warm-up recorded"
    with pytest.raises(EngineStateError, match="fresh engine"):
        warm_up(warmed, 600)


@pytest.mark.parametrize(("predicate", "logged"), [
    # A data exception (SQLSTATE class 22), as the engine reports it.
    ("1 DIV (k - 100) <= 1", "warm-up stopped early: table filter"),
    # Any other failure.
    ("CASE WHEN k = 100 THEN raise_error('made-up row') ELSE true END",
     "warm-up failed, the service starts without it"),
])
def test_a_failed_warm_up_is_logged_and_leaves_the_engine_fresh(
        spark: SparkSession, caplog: pytest.LogCaptureFixture, predicate: str, logged: str
) -> None:
    """Made-up rows may fail where real data never does (k = 100 here): the warm-up is only
    an optimization, so the engine is left fresh and computes real data as usual."""
    schema = TableSchema.of({"k": "bigint", "v": "bigint"})
    p = Pipeline()
    p.output("out", p.source("events", schema).filter(predicate)
             .groupby("k").reduce(n=r.count()), primary_key=["k"])
    engine = Engine(p, spark)
    with caplog.at_level("INFO", logger="txstream.engine.warmup"):
        warm_up(engine, 600)
    assert logged in caplog.text, caplog.text
    assert engine.last_batch is None
    assert all(not state.runs for state, _ in engine.version().states.values())
    out = process(engine, {"events": pa.table({"k": [1, 1, 2], "v": [0, 0, 0], "time": [1] * 3,
                                               "diff": [1] * 3})})["out"]
    assert sorted(out.select(["k", "n", "diff"]).to_pylist(), key=lambda row: row["k"]) == [
        {"k": 1, "n": 2, "diff": 1}, {"k": 2, "n": 1, "diff": 1}]


def test_a_warm_up_closed_after_its_first_batch_leaves_the_engine_fresh(
        spark: SparkSession) -> None:
    """The service ends a warm-up of its own engine when a real batch arrives
    (`PipelineRunner`): closed between batches, the made-up state is gone and the engine
    computes what a fresh one does."""
    warmed = Engine(orders_pipeline(), spark)
    steps = warming_up(warmed, 600)
    assert next(steps) == 1
    assert not warmed.fresh, "the made-up batch left state, as a real one would"
    steps.close()
    assert warmed.fresh and warmed.totals.jobs == 0
    fresh = Engine(orders_pipeline(), spark)
    for i, batch in enumerate(_stream(4)):
        ours, theirs = process(warmed, batch), process(fresh, batch)
        assert all(ours[name].equals(theirs[name]) for name in ours), f"batch {i}"
    with pytest.raises(EngineStateError, match="fresh engine"):
        warming_up(warmed, 600)  # refused at once, not at the first step


def test_a_warm_up_step_cancelled_during_its_job_ends_the_warm_up(
        spark: SparkSession, caplog: pytest.LogCaptureFixture) -> None:
    """The service cancels a made-up batch when a real one is ready (`WarmUp.cancel`, from a
    thread of its own, again and again until the step returns): here once the step's Spark job
    runs. The job is cancelled, the warm-up ends, and the engine is fresh again and computes
    what a fresh one does. The made-up batch is large, so that its job runs for a second or
    more, even on a warm JVM, while the cancel arrives within milliseconds."""
    warmed = Engine(orders_pipeline(), spark)
    steps = warming_up(warmed, 100_000)
    tracker = spark.sparkContext.statusTracker()
    returned = threading.Event()
    cancelled_during = []

    def cancel_once_a_job_runs() -> None:
        while not returned.wait(0.01):
            jobs = tracker.getActiveJobsIds()
            if jobs:
                cancelled_during.extend(jobs)
                steps.cancel()

    canceller = threading.Thread(target=cancel_once_a_job_runs)
    canceller.start()
    try:
        with caplog.at_level("INFO", logger="txstream.engine.warmup"):
            assert next(steps, None) is None, "the cancelled step ends the warm-up"
    finally:
        returned.set()
        canceller.join()
    assert cancelled_during and steps.cut_short
    assert "warm-up cut short" in caplog.text and "warm-up failed" not in caplog.text
    assert warmed.fresh and warmed.totals.jobs == 0
    fresh = Engine(orders_pipeline(), spark)
    for i, batch in enumerate(_stream(5)):
        ours, theirs = process(warmed, batch), process(fresh, batch)
        assert all(ours[name].equals(theirs[name]) for name in ours), f"batch {i}"
