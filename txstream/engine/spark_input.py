"""A source's changes of a batch on their way into the JVM: an Arrow table as an RDD of Spark
rows with the attributes of a leaf over it (`input_rows`), split into partitions where the
readers cluster them (`partitioned_rows`), with no Spark job.

Spark's internal API used here (see `txstream.engine.spark_internals` for why it is kept in
few modules): `sql.catalyst.plans.logical.LocalRelation.data()` (and its `size()`);
`SparkContext.parallelize(Seq, n, ClassTag)` (JVM side); `rdd.RDD.getNumPartitions()`,
`coalesce(n, shuffle, partitionCoalescer, ordering)`; the session setting
`spark.sql.execution.arrow.localRelationThreshold`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
from py4j.java_gateway import JavaObject
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from txstream.engine.errors import InvariantError
from txstream.engine.spark_internals import Clustering, analyzed, jvm_of, union_rdd

# Below this size, createDataFrame converts Arrow data to rows on the driver.
_LOCAL_RELATION_BYTES = "spark.sql.execution.arrow.localRelationThreshold"


@contextmanager
def _arrow_on_executors(spark: SparkSession) -> Iterator[None]:
    """`createDataFrame` of Arrow data keeps its record batches for the task to convert
    (Spark otherwise converts small ones to rows on the driver)."""
    conf = spark.conf
    previous = conf.get(_LOCAL_RELATION_BYTES, None)
    conf.set(_LOCAL_RELATION_BYTES, "0")
    try:
        yield
    finally:
        if previous is None:
            conf.unset(_LOCAL_RELATION_BYTES)
        else:
            conf.set(_LOCAL_RELATION_BYTES, previous)


def input_rows(spark: SparkSession, table: pa.Table, schema: StructType, columnar: bool
               ) -> tuple[JavaObject, JavaObject]:
    """`table` as an RDD of rows, with no Spark job, and the attributes of a leaf over it (a
    leaf `rebind` can replace). Not `columnar`: the driver's rows, converted on the driver and
    shipped in the task, as one partition; `columnar`: Arrow record batches the task
    converts."""
    # Spark reads the table as Arrow record batches, one per chunk, and the rows of a local
    # relation stop at the first empty one (Spark 4.3's `ArrowConverters.InternalRowIterator
    # .hasNext` moves one batch ahead, not past empty ones): every row after an empty chunk was
    # silently dropped (a batch joins the changes of several polls, and an upsert source's
    # lone insertion comes after an empty chunk of retractions). Dropping them copies nothing.
    table = pa.Table.from_batches([b for b in table.to_batches() if b.num_rows],
                                  schema=table.schema)
    if not columnar:
        local = analyzed(spark.createDataFrame(table, schema=schema))
        rows = local.data()
        read = rows.size()
        if read != table.num_rows:  # one call: the rows are on the driver already
            raise InvariantError("the engine's input", f"Spark read {read} of the "
                                 f"{table.num_rows} rows of a source's changes")
        j = jvm_of(spark)
        return local.output(), j.context.parallelize(rows, 1, j.rows)
    with _arrow_on_executors(spark):
        batches = analyzed(spark.createDataFrame(table, schema=schema))
    return batches.output(), batches.rdd()


@dataclass(frozen=True)
class SourceRows:
    """A source's changes of a batch as Spark rows: the attributes of a leaf over `rdd`, the
    partitioning that leaf declares (`rdd_node`), and the columns it is clustered by."""

    output: JavaObject
    rdd: JavaObject
    clustering: Clustering | None = None
    clustered_by: tuple[str, ...] | None = None


def partitioned_rows(spark: SparkSession, tables: Sequence[pa.Table], schema: StructType,
                     columnar: bool) -> tuple[JavaObject, JavaObject]:
    """As `input_rows`, an RDD whose partition i holds the rows of `tables[i]` (narrowly
    coalesced: no shuffle; an empty table, as an empty partition)."""
    j = jvm_of(spark)
    output, rdds = None, []
    for table in tables:
        # Spark makes a local relation, not an RDD, of Arrow data with no record batch.
        output, rdd = input_rows(spark, table, schema, columnar and table.num_rows > 0)
        rdds.append(rdd if rdd.getNumPartitions() == 1 else rdd.coalesce(1, False, j.none, None))
    assert output is not None, "at least one partition"
    rows = union_rdd(spark, rdds)
    assert rows.getNumPartitions() == len(tables), "one partition per table"
    return output, rows
