"""The leaves of a batch's plans, as Spark's own logical nodes built through py4j, and the
rebinding of a plan to other leaves.

A batch's plans read three kinds of leaves: input deltas and state (an RDD of rows each, a
`LogicalRDD`), and frames computed once per batch (an `InMemoryRelation`, see `cached_leaf`).
Each leaf has a key that survives Spark's copies of it (the deduplication of a self-join gives
a copy fresh attribute ids): the id of its RDD, or the name of its cached relation. `rebind`
replaces leaves by key in an analyzed plan, keeping each occurrence's attributes, so the rest
of the plan stays valid without being analyzed again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

LeafKey = tuple[str, int | str]
_names = itertools.count(1)


def frame_of(spark: SparkSession, plan: JavaObject) -> DataFrame:
    """A frame over an analyzed logical plan."""
    jvm = spark._jvm
    assert jvm is not None
    return ClassicDataFrame(
        jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan), spark)


def analyzed(frame: DataFrame) -> JavaObject:
    return frame._jdf.queryExecution().analyzed()


def _module(spark: SparkSession, path: str) -> JavaObject:
    """A Scala object (`scala.collection.immutable.Nil`, ...)."""
    node = spark._jvm
    assert node is not None
    package, _, name = path.rpartition(".")
    for part in package.split("."):
        node = getattr(node, part)
    return getattr(node, f"{name}$").__getattr__("MODULE$")


def _row_tag(spark: SparkSession) -> JavaObject:
    return _module(spark, "scala.reflect.ClassTag").AnyRef()


def _seq(spark: SparkSession, items: Sequence[JavaObject]) -> JavaObject:
    jvm = spark._jvm
    assert jvm is not None
    array = jvm.java.util.ArrayList()
    for item in items:
        array.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(array).toSeq()


def union_rdd(spark: SparkSession, rdds: Sequence[JavaObject]) -> JavaObject:
    """The rows of `rdds` (RDD[InternalRow]) as one RDD, with no job and no closure."""
    sc = spark._jsparkSession.sparkContext()
    if not rdds:
        return sc.emptyRDD(_row_tag(spark))
    if len(rdds) == 1:
        return rdds[0]
    return sc.union(_seq(spark, rdds), _row_tag(spark))


def rdd_node(spark: SparkSession, output: JavaObject, rdd: JavaObject) -> JavaObject:
    """A `LogicalRDD` reading `rdd` with the attributes `output`. Its partitioning is unknown:
    readers that need one partition coalesce."""
    jvm = spark._jvm
    assert jvm is not None
    none = jvm.scala.Option.empty()
    unknown = jvm.org.apache.spark.sql.catalyst.plans.physical.UnknownPartitioning(
        rdd.getNumPartitions())
    return jvm.org.apache.spark.sql.execution.LogicalRDD(
        output, rdd, unknown, _module(spark, "scala.collection.immutable.Nil"), False, none,
        spark._jsparkSession, none, none, False)


def rdd_leaf(spark: SparkSession, output: JavaObject, rdd: JavaObject) -> DataFrame:
    """`rdd` as a frame with fresh attributes of the same names and types as `output`."""
    return frame_of(spark, rdd_node(spark, output, rdd).newInstance())


def rdd_of(frame: DataFrame) -> JavaObject:
    """The RDD of a frame whose plan is a `LogicalRDD` (a local checkpoint, an `rdd_leaf`)."""
    return analyzed(frame).rdd()


def local_rows(frame: DataFrame) -> JavaObject:
    """The rows of a frame over a local relation (`createDataFrame`) as an RDD of one
    partition: a leaf `rebind` can replace."""
    spark = frame.sparkSession
    data = analyzed(frame).data()
    return spark._jsparkSession.sparkContext().parallelize(data, 1, _row_tag(spark))


def cached_relation(frame: DataFrame) -> JavaObject:
    """The in-memory relation Spark's cache builds for `frame`, under a name of its own (its
    key), not registered in the cache manager (which every later plan would be matched
    against)."""
    spark = frame.sparkSession
    jvm = spark._jvm
    assert jvm is not None
    return _module(spark, "org.apache.spark.sql.execution.columnar.InMemoryRelation").apply(
        jvm.org.apache.spark.storage.StorageLevel.MEMORY_AND_DISK(), frame._jdf.queryExecution(),
        jvm.scala.Option.apply(f"txstream-{next(_names)}"))


def key_of(leaf: JavaObject) -> LeafKey | None:
    """The key of a leaf `rebind` can replace; None for others (constant relations)."""
    name = leaf.nodeName()
    if name == "LogicalRDD":
        return ("rdd", leaf.rdd().id())
    if name == "InMemoryRelation":
        return ("cached", leaf.cacheBuilder().tableName().get())
    return None


def leaves(plan: JavaObject) -> list[JavaObject]:
    """Every leaf occurrence of a plan, the plans of its cached relations excluded."""
    found = plan.collectLeaves()
    return [found.apply(i) for i in range(found.size())]


@dataclass(frozen=True)
class Occurrence:
    """One leaf of a recorded plan: its node, its key, and its attributes."""

    node: JavaObject
    key: LeafKey
    output: JavaObject


def occurrences(plan: JavaObject) -> list[Occurrence]:
    found = []
    for leaf in leaves(plan):
        key = key_of(leaf)
        if key is not None:
            found.append(Occurrence(leaf, key, leaf.output()))
    return found


Replacement = Callable[[JavaObject], JavaObject]  # a leaf's attributes -> the node to put there


def rebind(spark: SparkSession, plan: JavaObject, found: Sequence[Occurrence],
           bindings: Mapping[LeafKey, Replacement]) -> JavaObject:
    """`plan` with each occurrence in `found` replaced through `bindings` (every key must be
    bound), marked analyzed: its nodes were, and the new leaves keep the attributes."""
    replace = _module(spark, "scala.collection.immutable.Map").empty()
    for occ in found:
        replace = replace.updated(occ.node, bindings[occ.key](occ.output))
    rebound = plan.transformUp(replace)
    rebound.setAnalyzed()
    return rebound
