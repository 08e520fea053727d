"""Small rebound batches aggregate with Spark's object hash aggregate, which spares the driver
the closure cleaner's parse of a large class for every aggregate node of every batch.

    rebound batch rewriting fewer rows than `Engine.interpreted_rows` (500) ... object hash
    any other batch .................................................. Spark's own choice

Each batch executes its physical plans into RDDs anew (a rebound plan's nodes are new copies).
`HashAggregateExec` hands its function to the public `RDD.mapPartitionsWithIndex`, whose closure
cleaner reads the class that declared the function, `HashAggregateExec` (119 KB of class file),
from its jar and parses all of it, nothing cached between calls: in profiles of lone
transactions of the example pipeline that was a fifth of the driver thread's samples
(docs/benchmarks.md, "Where a batch's driver time goes"). `ObjectHashAggregateExec` has the same
fields and computes the same aggregates (Spark plans it for any mix of aggregate functions as
soon as one keeps an object as its buffer) through the internal
`mapPartitionsWithIndexInternal`, which cleans nothing, and takes no page of execution memory
before its groups need sorting.

It keeps its groups in a Java hash map until there are
`spark.sql.objectHashAggregate.sortBased.fallbackThreshold` of them (128), then sorts: on a
large input slower than Spark's hash aggregate, whose memory Spark also accounts for. So only
small batches get it, those whose expressions are interpreted because they are small
(`txstream.engine.codegen`), and only rebound ones: their plans are the templates'
(`txstream.engine.templates`), rewritten once per template, where a batch built by the
operators would pay the rewrite every time. A template's plans hold no data, so the rewrite
keeps no batch alive either.

Spark's internal API used (see `txstream.engine.spark_internals` for the rest):
`sql.execution.aggregate.HashAggregateExec`'s fields (`requiredChildDistributionExpressions()`,
`isStreaming()`, `numShufflePartitions()`, `groupingExpressions()`, `aggregateExpressions()`,
`aggregateAttributes()`, `initialInputBufferOffset()`, `resultExpressions()`, `child()`),
`ObjectHashAggregateExec`'s constructor of the same fields; a `SparkPlan`'s `children()` and
`withNewChildren(Seq)`.
"""

from __future__ import annotations

from py4j.java_gateway import JavaObject
from pyspark.sql import SparkSession

from txstream.engine.spark_internals import scala_seq


def small(rewritten: int, interpreted_rows: int) -> bool:
    """Whether a rebound batch rewriting `rewritten` rows (its input and the state runs it
    merges) runs object hash aggregates."""
    return rewritten < interpreted_rows


def with_object_aggregates(spark: SparkSession, plan: JavaObject) -> JavaObject:
    """The physical `plan` with every `HashAggregateExec` an `ObjectHashAggregateExec` of the
    same fields; its leaves are the same nodes, so they are replaced as `plan`'s are."""
    return _rewritten(spark, plan)[0]


def _rewritten(spark: SparkSession, node: JavaObject) -> tuple[JavaObject, bool]:
    children = node.children()
    below = [_rewritten(spark, children.apply(i)) for i in range(children.size())]
    changed = any(c for _, c in below)
    if changed:
        node = node.withNewChildren(scala_seq(spark, [n for n, _ in below]))
    if node.getClass().getSimpleName() != "HashAggregateExec":
        return node, changed
    aggregate = spark._jvm.org.apache.spark.sql.execution.aggregate.ObjectHashAggregateExec
    return aggregate(
        node.requiredChildDistributionExpressions(), node.isStreaming(),
        node.numShufflePartitions(), node.groupingExpressions(), node.aggregateExpressions(),
        node.aggregateAttributes(), node.initialInputBufferOffset(), node.resultExpressions(),
        node.child()), True
