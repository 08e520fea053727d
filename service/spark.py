"""The long-lived SparkSession: `local[2]` by default, `SPARK_MASTER` selects a cluster."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"


def get_spark(master: str | None = None, app_name: str = "txstream") -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    Few shuffle partitions and no adaptive execution: the engine's jobs are many and small, and
    their fixed cost, not parallelism, dominates (see DESIGN.md section 8).
    """
    master = master or os.environ.get("SPARK_MASTER", DEFAULT_MASTER)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "2"))
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "4g"))
        # Old state versions are released by the context cleaner once unreferenced.
        .config("spark.cleaner.periodicGC.interval", "1min")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
