"""The files of a saved engine state (`Engine.save_state`): each state's Parquet, written by
Spark jobs submitted at once, and the manifest, written without a Spark job."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import SparkSession

from txstream.engine.state import Runs, ZSetState

# Jobs writing states submitted at once (each a few tasks; Spark queues what it cannot run).
_WRITING = 16


def write_states(path: str, states: Mapping[str, tuple[ZSetState, Runs]]) -> None:
    """Write each state's runs under `path`/<its name>, in Spark jobs submitted together: one
    after the other, a small state's checkpoint (at a stop, while nothing else runs) waited
    out each job's fixed cost in turn (planning it, starting its tasks, committing its files),
    not the data, for most of its time."""
    if not states:
        return
    with ThreadPoolExecutor(min(len(states), _WRITING), thread_name_prefix="save-state") as pool:
        writes = [pool.submit(state.save, f"{path}/{name}", runs)
                  for name, (state, runs) in states.items()]
        for write in writes:
            write.result()  # the first failure, once every write has ended


def write_manifest(spark: SparkSession, path: str, text: str) -> None:
    """`text` as the one file of the directory `path` (what `spark.read.text(path)` reads
    back), through Hadoop's file system API: a Spark job writing it took seconds in a JVM that
    had not written text before (a first checkpoint, at a stop)."""
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None, "a SparkSession has a JVM gateway"
    file = jvm.org.apache.hadoop.fs.Path(f"{path}/part-00000.txt")
    fs = file.getFileSystem(sc._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    out = fs.create(file, False)  # overwrite=false: a state is saved into a new directory
    try:
        out.write(bytearray(text.encode()))
    finally:
        out.close()
