"""Where the engine finds a state run's blocks (`txstream.engine.replicas`), in local mode: the
driver's own block manager is the one executor. Losing and copying blocks across executors is
`tests/test_executor_loss.py`, on a standalone cluster."""

from __future__ import annotations

from pyspark.sql import SparkSession

from txstream.engine.replicas import executors, fewest_copies, keep_replicated
from txstream.engine.spark_internals import rdd_of


def test_a_local_checkpoint_is_found_once_per_partition(spark: SparkSession) -> None:
    stored = spark.range(30).repartition(3).localCheckpoint(eager=True)
    assert fewest_copies(spark, [rdd_of(stored)]) == [1]


def test_blocks_removed_or_never_stored_count_as_lost(spark: SparkSession) -> None:
    removed = rdd_of(spark.range(30).repartition(3).localCheckpoint(eager=True))
    kept = rdd_of(spark.range(30).repartition(3).localCheckpoint(eager=True))
    never_stored = rdd_of(spark.range(5).localCheckpoint(eager=False))
    removed.unpersist(True)  # as when the executor holding its only copies dies
    assert fewest_copies(spark, [removed, never_stored, kept]) == [0, 0, 1]


def test_nothing_is_copied_while_too_few_executors_are_alive(spark: SparkSession) -> None:
    assert executors(spark) == 0  # local mode: the driver's block manager only
    assert keep_replicated(spark, [], replicas=2) == 0
