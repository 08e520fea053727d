"""The long-lived SparkSession: `local[2]` by default, `SPARK_MASTER` selects a cluster."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"


def get_spark(master: str | None = None, app_name: str = "txstream") -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    Few shuffle partitions, no adaptive execution and no broadcasts: the engine's batches are
    small jobs whose fixed cost, not parallelism, dominates (see DESIGN.md section 8).
    """
    master = master or os.environ.get("SPARK_MASTER", DEFAULT_MASTER)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "2"))
        .config("spark.sql.adaptive.enabled", "false")
        # A broadcast is a Spark job of its own; the engine's joins build their hash table from
        # the batch's delta instead (see service.engine.frames.build_side).
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
        # A join of single-partition inputs stays in one partition only while Spark's size
        # estimate allows; estimates of checkpointed join results are products of products.
        .config("spark.sql.maxSinglePartitionBytes", str(2**63 - 1))
        # A batch's plans need a few hundred compiled expressions, the same ones every batch;
        # Spark's default cache of 100 would have them evict each other, and every batch would
        # recompile them (and the JIT recompile those classes). Whole-stage code is unique to
        # each plan (its limit counters are numbered process-wide), so it would be compiled
        # anew for every batch: off.
        .config("spark.sql.codegen.cache.maxEntries", "10000")
        .config("spark.sql.codegen.wholeStage", "false")
        # Every action renders its plan for the SQL listener; the default, formatted, costs a
        # batch's planning about half a second more.
        .config("spark.sql.ui.explainMode", "simple")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "4g"))
        # Old state versions are released by the context cleaner once unreferenced.
        .config("spark.cleaner.periodicGC.interval", "1min")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
