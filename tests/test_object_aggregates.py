"""Small rebound batches' hash aggregates become Spark's object hash aggregates
(`txstream.engine.object_aggregates`): the same rows, every hash aggregate replaced, and only
in small batches. The engine's oracles (tests/support/engine_oracle.py) check pipelines whose
rebound batches of one transaction run them."""

from __future__ import annotations

import random

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from support.engine_oracle import process

from txstream.engine import Engine
from txstream.engine.object_aggregates import small, with_object_aggregates
from txstream.engine.spark_internals import frame_over, optimized, physical_plan
from txstream.examples.order_events import as_changes, events
from txstream.examples.orders import pipeline as orders_pipeline


def _classes(plan: JavaObject) -> list[str]:
    children = plan.children()
    return [plan.getClass().getSimpleName(),
            *(c for i in range(children.size()) for c in _classes(children.apply(i)))]


def _rows(frame: DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


def test_the_rewritten_plan_computes_the_same_rows(spark: SparkSession) -> None:
    base = spark.createDataFrame(
        [(k % 7, k % 3, float(k), None if k % 5 == 0 else f"s{k % 11}") for k in range(300)],
        "k int, j int, v double, s string")
    # Nested aggregates, more groups than the object aggregate's sort fallback (128) included,
    # and one with no grouping key.
    frame = (base.groupBy("k", "j", "s").agg(F.sum("v").alias("v"), F.count("*").alias("n"))
             .groupBy("k").agg(F.max("v").alias("top"), F.min("s").alias("first"),
                               F.sum("n").alias("n"), F.avg("v").alias("mean")))
    wide = base.groupBy("v").agg(F.count("*").alias("n"))
    total = base.agg(F.sum("v").alias("v"), F.count("s").alias("n"))
    for query in (frame, wide, total):
        physical = physical_plan(query)
        assert "HashAggregateExec" in _classes(physical)
        rewritten = with_object_aggregates(spark, physical)
        classes = _classes(rewritten)
        assert "HashAggregateExec" not in classes and "ObjectHashAggregateExec" in classes
        over = frame_over(spark, optimized(query), rewritten)
        assert _rows(over) == _rows(query)


def test_only_small_batches_get_them() -> None:
    assert small(499, 500) and not small(500, 500) and not small(10, 0)


def test_a_rebound_lone_transaction_of_the_example_runs_them(spark: SparkSession) -> None:
    engine = Engine(orders_pipeline(), spark)
    stream = events(random.Random(3), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    process(engine, as_changes([next(stream) for _ in range(2_000)], rows, 1))
    assert engine.last_batch is not None and not engine.last_batch.object_aggregates
    ran = []
    for time in range(2, 8):
        process(engine, as_changes([next(stream) for _ in range(10)], rows, time))
        assert engine.last_batch is not None
        assert engine.last_batch.object_aggregates == engine.last_batch.rebound
        ran.append(engine.last_batch.object_aggregates)
    assert any(ran)
