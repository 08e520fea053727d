"""Spark's status store keeps the history of the last few queries, jobs and stages, not Spark's
default thousand of each, so that a long-running service's heap does not grow with its batches
(`txstream.service.spark`); a batch's jobs are still counted from it
(`txstream.engine.sparkjobs`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from txstream.engine.sparkjobs import counted

KEPT_QUERIES, KEPT_JOBS = 20, 200


def _settles(size: Callable[[], int], most: int) -> int:
    """`size()` once it is at most `most` (within 10 s): the store drops old entries on a
    thread of its own, once more are kept than allowed."""
    deadline = time.monotonic() + 10
    while (found := size()) > most and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_the_status_store_keeps_the_last_queries_only(spark: SparkSession) -> None:
    sql_store = spark._jsparkSession.sharedState().statusStore()  # type: ignore[union-attr]
    for i in range(KEPT_QUERIES + 10):
        assert spark.range(i + 1).count() == i + 1
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)  # type: ignore[union-attr]
    kept = _settles(sql_store.executionsCount, KEPT_QUERIES)
    assert 0 < kept <= KEPT_QUERIES, f"{kept} queries kept"


def test_a_batchs_jobs_are_counted_after_more_jobs_ran_than_are_kept(
        spark: SparkSession) -> None:
    sc = spark.sparkContext
    for _ in range(KEPT_JOBS + 20):
        sc.parallelize([1], 1).count()
    _, count = counted(sc, lambda: sc.parallelize([1, 2], 1).count())
    assert (count.jobs, count.stages) == (1, 1)
    context = sc._jsc.sc()  # type: ignore[union-attr]
    context.listenerBus().waitUntilEmpty(10_000)
    kept = _settles(lambda: context.statusStore().jobsList(None).size(), KEPT_JOBS)
    assert KEPT_JOBS // 2 < kept <= KEPT_JOBS, f"{kept} jobs kept"
