"""Every use the engine makes of Spark's internal (JVM) API for its plans, in one module (the
block manager's, where state blocks are, is in `txstream.engine.replicas`; the input's way into
the JVM, in `txstream.engine.spark_input`): Spark keeps these classes stable neither in name nor
in signature across minor releases, so upgrading Spark means checking these three modules (and
running the engine's tests), nothing else. pyproject.toml pins
pyspark to the minor release they were written and tested against.

What the engine builds through py4j is the leaves of a batch's plans, as Spark's own nodes. A
batch's plans read three kinds of leaves: input deltas, state and the list of a state's index
files (an RDD of rows each: a `LogicalRDD`, scanned by an `RDDScanExec`), and frames computed
once per batch (an `InMemoryRelation`, scanned by an `InMemoryTableScanExec`, see
`BatchPlan.shared`). Each leaf has a key that survives Spark's copies of it (the deduplication
of a self-join gives a copy fresh attribute ids): the id of its RDD, or the name of its cached
relation. `rebind` replaces leaves by key in a logical plan and `replace_leaves` the scans of a
physical one, keeping each occurrence's attributes; `frame_over` hands a physical plan to Spark
as a frame to run.

The internal API used, by class (org.apache.spark unless Scala or Java):

- `sql.classic.Dataset.ofRows(session, plan)`, and pyspark's `sql.classic.dataframe.DataFrame`
  (`ClassicDataFrame`) over it: a frame over a plan built here (`frame_of`).
- `DataFrame._jdf.queryExecution()`: `.analyzed()`, `.optimizedPlan()`, `.sparkPlan()`,
  `.executedPlan()`.
- `sql.catalyst.plans.logical.LogicalPlan` and `sql.execution.SparkPlan` (any node):
  `nodeName()`, `output()`, `child()`, `apply(i)`, `deterministic()`, `collectLeaves()`,
  `transformUp(partial function)` (given an immutable Scala `Map` as the partial function),
  `setAnalyzed()`, `newInstance()` (of a leaf); `outputPartitioning()`;
  `containsPattern(sql.catalyst.trees.TreePattern.PLAN_EXPRESSION)`.
- `sql.execution.LogicalRDD(output, rdd, outputPartitioning, outputOrdering, isStreaming,
  stats, session, originStats, originConstraints, stream)`, `rdd()`;
  `sql.execution.RDDScanExec(output, rdd, name, outputPartitioning, outputOrdering, stream)`,
  `rdd()`;
  `sql.execution.adaptive.LogicalQueryStage(logicalPlan, physicalPlan)`.
- `sql.catalyst.plans.physical.UnknownPartitioning(n)`, `HashPartitioning(expressions, n)`
  (`expressions()`, `numPartitions()`), `PartitioningCollection(partitionings)`
  (`partitionings()`); `CreateStruct.apply(expressions)`; an attribute's `name()`; a
  partitioning's or an expression's `getClass().getSimpleName()`.
- `sql.execution.columnar.InMemoryRelation.apply(storageLevel, queryExecution, tableName)`,
  `cacheBuilder().tableName()`, `withOutput(attributes)`, `cachedPlan()`;
  `InMemoryTableScanExec(attributes, predicates, relation)`, `relation()`, `execute()`;
  `storage.StorageLevel.MEMORY_AND_DISK`.
- `SparkContext` (JVM side): `emptyRDD`, `union(Seq, ClassTag)`; `rdd.RDD.id()`,
  `getNumPartitions()`, `count()`; `rdd.SQLPartitioningAwareUnionRDD(context, Seq, n,
  ClassTag)`.
- Scala and Java: `scala.collection.immutable.Nil`, `scala.collection.immutable.Map.empty()`,
  `scala.Option` (`empty()`, `apply`), `scala.reflect.ClassTag.AnyRef()`,
  `scala.jdk.javaapi.CollectionConverters.asScala`, `java.util.ArrayList`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

LeafKey = tuple[str, int | str]
# The name Spark's planner gives the scan of a `LogicalRDD` (its node's name: "Scan " + this,
# then the RDD's name if it has one).
_EXISTING_RDD = "ExistingRDD"
_names = itertools.count(1)


def frame_of(spark: SparkSession, plan: JavaObject) -> DataFrame:
    """A frame over an analyzed logical plan."""
    j = jvm_of(spark)
    return ClassicDataFrame(j.dataset.ofRows(j.session, plan), spark)


def analyzed(frame: DataFrame) -> JavaObject:
    return frame._jdf.queryExecution().analyzed()


def plan_now(frame: DataFrame) -> None:
    """Plan `frame` physically now (Spark keeps the plan for the action that runs it)."""
    frame._jdf.queryExecution().executedPlan()


def attributes(frame: DataFrame) -> JavaObject:
    """The attributes a frame's analyzed plan outputs."""
    return analyzed(frame).output()


def one_operator(frame: DataFrame, operator: str) -> tuple[bool, bool]:
    """Whether `frame`'s analyzed plan is exactly one `operator` node (`Project`, `Filter`)
    over a leaf, and whether that plan is deterministic."""
    plan = analyzed(frame)
    return plan.nodeName() == operator and plan.apply(2) is None, plan.deterministic()


def _module(spark: SparkSession, path: str) -> JavaObject:
    """A Scala object (`scala.collection.immutable.Nil`, ...)."""
    node = spark._jvm
    assert node is not None
    package, _, name = path.rpartition(".")
    for part in package.split("."):
        node = getattr(node, part)
    return getattr(node, f"{name}$").__getattr__("MODULE$")


@dataclass(frozen=True)
class _Jvm:
    """The JVM classes and objects a batch's leaves are made of, looked up once per session:
    each lookup is a round trip to the JVM, and a batch makes a hundred leaves."""

    session: JavaObject
    context: JavaObject
    logical_rdd: JavaObject
    unknown: JavaObject  # UnknownPartitioning(0)
    hash_partitioning: JavaObject
    partitionings: JavaObject  # PartitioningCollection
    create_struct: JavaObject
    partition_union: JavaObject
    nil: JavaObject
    none: JavaObject
    rows: JavaObject  # ClassTag of an RDD's elements
    empty_map: JavaObject
    array_list: JavaObject
    as_scala: JavaObject
    in_memory_relation: JavaObject
    memory_and_disk: JavaObject
    dataset: JavaObject
    option: JavaObject
    rdd_scan: JavaObject  # RDDScanExec
    in_memory_scan: JavaObject  # InMemoryTableScanExec
    query_stage: JavaObject  # LogicalQueryStage
    plan_expression: JavaObject  # the tree pattern of an expression holding a plan


@cache
def jvm_of(spark: SparkSession) -> _Jvm:
    jvm = spark._jvm
    assert jvm is not None
    return _Jvm(
        session=spark._jsparkSession,
        context=spark._jsparkSession.sparkContext(),
        logical_rdd=jvm.org.apache.spark.sql.execution.LogicalRDD,
        unknown=jvm.org.apache.spark.sql.catalyst.plans.physical.UnknownPartitioning(0),
        hash_partitioning=jvm.org.apache.spark.sql.catalyst.plans.physical.HashPartitioning,
        partitionings=jvm.org.apache.spark.sql.catalyst.plans.physical.PartitioningCollection,
        create_struct=_module(spark, "org.apache.spark.sql.catalyst.expressions.CreateStruct"),
        partition_union=jvm.org.apache.spark.rdd.SQLPartitioningAwareUnionRDD,
        nil=_module(spark, "scala.collection.immutable.Nil"),
        none=jvm.scala.Option.empty(),
        rows=_module(spark, "scala.reflect.ClassTag").AnyRef(),
        empty_map=_module(spark, "scala.collection.immutable.Map").empty(),
        array_list=jvm.java.util.ArrayList,
        as_scala=jvm.scala.jdk.javaapi.CollectionConverters,
        in_memory_relation=_module(
            spark, "org.apache.spark.sql.execution.columnar.InMemoryRelation"),
        memory_and_disk=jvm.org.apache.spark.storage.StorageLevel.MEMORY_AND_DISK(),
        dataset=jvm.org.apache.spark.sql.classic.Dataset,
        option=jvm.scala.Option,
        rdd_scan=jvm.org.apache.spark.sql.execution.RDDScanExec,
        in_memory_scan=jvm.org.apache.spark.sql.execution.columnar.InMemoryTableScanExec,
        query_stage=jvm.org.apache.spark.sql.execution.adaptive.LogicalQueryStage,
        plan_expression=jvm.org.apache.spark.sql.catalyst.trees.TreePattern.PLAN_EXPRESSION(),
    )


# --- leaves ----------------------------------------------------------------------------------

def id_of(rdd: JavaObject) -> int:
    """An RDD's id, unique in its context."""
    return rdd.id()


def _seq(spark: SparkSession, items: Sequence[JavaObject]) -> JavaObject:
    j = jvm_of(spark)
    array = j.array_list()
    for item in items:
        array.add(item)
    return j.as_scala.asScala(array).toSeq()


def union_rdd(spark: SparkSession, rdds: Sequence[JavaObject], partitions: int = 0
              ) -> JavaObject:
    """The rows of `rdds` (RDD[InternalRow]) as a new RDD (a leaf key of its own), with no job
    and no closure. With `partitions` (each of `rdds` has that many, alike partitioned):
    partition i of the result is partition i of every RDD, so it keeps their partitioning
    (and runs where their blocks are); none of `rdds` gives that many empty partitions."""
    j = jvm_of(spark)
    if partitions:
        if not rdds:
            return j.context.parallelize(_seq(spark, []), partitions, j.rows)
        return j.partition_union(j.context, _seq(spark, rdds), partitions, j.rows)
    if not rdds:
        return j.context.emptyRDD(j.rows)
    return j.context.union(_seq(spark, rdds), j.rows)


def materialize(spark: SparkSession, rdds: Sequence[JavaObject]) -> None:
    """Compute `rdds` (lazy local checkpoints, of rows) in one Spark job: their union is
    counted, after which Spark checkpoints each of them (the checkpoint of an RDD follows the
    first job computing it, and a union passes it on to its parents)."""
    if rdds:
        union_rdd(spark, rdds).count()


Clustering = tuple[tuple[int, ...], int]  # positions of the hashed columns, partition count

# The partitionings leaves declared (`_partitioning`), by (the gateway, the JVM object of their
# attributes, clustering): a template rebinds the same leaves every batch, and each
# declaration is about twenty calls into the JVM. py4j never reuses an object id within one
# gateway; the cache is emptied whole when full, which only costs building them again.
_declared: dict[tuple[int, str, Clustering], JavaObject] = {}
_DECLARED = 4096


def _partitioning(spark: SparkSession, output: JavaObject, clustering: Clustering | None
                  ) -> JavaObject:
    """The partitioning a leaf over `output` declares (see `rdd_node`)."""
    j = jvm_of(spark)
    if clustering is None:
        return j.unknown
    key = (id(spark._jvm), output._target_id, clustering)
    partitioning = _declared.get(key)
    if partitioning is None:
        positions, partitions = clustering
        columns = _seq(spark, [output.apply(i) for i in positions])
        partitioning = j.partitionings(_seq(spark, [
            j.hash_partitioning(columns, partitions),
            j.hash_partitioning(_seq(spark, [j.create_struct.apply(columns)]), partitions)]))
        if len(_declared) >= _DECLARED:
            _declared.clear()
        _declared[key] = partitioning
    return partitioning


def rdd_node(spark: SparkSession, output: JavaObject, rdd: JavaObject,
             clustering: Clustering | None = None) -> JavaObject:
    """A `LogicalRDD` reading `rdd` with the attributes `output`. Its partitioning is unknown
    (readers that need one partition coalesce) unless `clustering` declares it: hashed by the
    columns at those positions into that many partitions, as `repartition(n, *columns)`
    places rows, which the planner then trusts (a join or aggregate by those columns adds no
    exchange on this side). The declaration must be true of `rdd`.

    Declared twice: by the columns, and by one struct of them (`frames.struct_key`). Spark's
    hash of a struct is the hash of its fields in order, so both place every row alike; the second
    serves joins on the struct, which match nulls to nulls where a join by the columns would
    need `<=>`, which Spark plans on other expressions and so exchanges this side."""
    j = jvm_of(spark)
    return j.logical_rdd(output, rdd, _partitioning(spark, output, clustering), j.nil, False,
                         j.none, j.session, j.none, j.none, False)


def rdd_scan(spark: SparkSession, output: JavaObject, rdd: JavaObject,
             clustering: Clustering | None = None) -> JavaObject:
    """The physical leaf Spark plans for `rdd_node(spark, output, rdd, clustering)`."""
    j = jvm_of(spark)
    return j.rdd_scan(output, rdd, _EXISTING_RDD, _partitioning(spark, output, clustering),
                      j.nil, j.none)


def hash_clusterings(frame: DataFrame) -> list[tuple[list[str], int]]:
    """The hash partitionings by columns a frame's `LogicalRDD` (a local checkpoint) reports,
    as columns and partition count: one, several from a collection (a leaf of `rdd_node`
    reports its two; a checkpoint of a join only its first side's, as Spark's checkpoint
    keeps the first member of a collection), or none."""
    return _by_columns(analyzed(frame).outputPartitioning())


def _by_columns(partitioning: JavaObject) -> list[tuple[list[str], int]]:
    kind = partitioning.getClass().getSimpleName()
    if kind == "PartitioningCollection":
        members = partitioning.partitionings()
        return [c for i in range(members.size()) for c in _by_columns(members.apply(i))]
    if kind != "HashPartitioning":
        return []
    expressions = partitioning.expressions()
    names = []
    for i in range(expressions.size()):
        expression = expressions.apply(i)
        if expression.getClass().getSimpleName() != "AttributeReference":
            return []
        names.append(expression.name())
    return [(names, partitioning.numPartitions())]


def rdd_leaf(spark: SparkSession, output: JavaObject, rdd: JavaObject,
             clustering: Clustering | None = None) -> DataFrame:
    """`rdd` as a frame with fresh attributes of the same names and types as `output` (its
    partitioning declared as `rdd_node` does)."""
    return frame_of(spark, rdd_node(spark, output, rdd, clustering).newInstance())


def rdd_of(frame: DataFrame) -> JavaObject:
    """The RDD of a frame whose plan is a `LogicalRDD` (a local checkpoint, an `rdd_leaf`)."""
    return analyzed(frame).rdd()


def cached_relation(frame: DataFrame) -> JavaObject:
    """The in-memory relation Spark's cache builds for `frame`, under a name of its own (its
    key), not registered in the cache manager (which every later plan would be matched
    against)."""
    j = jvm_of(frame.sparkSession)
    return j.in_memory_relation.apply(j.memory_and_disk, frame._jdf.queryExecution(),
                                      j.option.apply(f"txstream-{next(_names)}"))


def cached_rows(spark: SparkSession, relation: JavaObject, clustering: Clustering | None
                ) -> JavaObject | None:
    """The rows of a cached relation (the RDD of the scan Spark plans for it, made directly:
    planning a frame over it took 13 ms; it fills the cache when a job first reads it) when
    the physical plan it computes is hash-partitioned as `clustering` says (by the columns at
    those positions of its output, into that many partitions): a leaf over them then declares
    that partitioning (`rdd_node`). None otherwise: readers read the relation itself."""
    if clustering is None:
        return None
    j, output = jvm_of(spark), relation.output()
    names = [output.apply(i).name() for i in clustering[0]]
    if (names, clustering[1]) not in _by_columns(relation.cachedPlan().outputPartitioning()):
        return None
    return j.in_memory_scan(output, j.nil, relation).execute()


# --- rebinding -------------------------------------------------------------------------------

def key_of(leaf: JavaObject) -> LeafKey | None:
    """The key of a leaf `rebind` or `replace_leaves` can replace, logical or physical (by the
    names Spark gives the nodes it plans for those); None for others."""
    name = leaf.nodeName()
    if name == "LogicalRDD" or name.startswith(f"Scan {_EXISTING_RDD}"):  # an RDDScanExec
        return ("rdd", leaf.rdd().id())
    if name == "InMemoryRelation":
        return ("cached", leaf.cacheBuilder().tableName().get())
    if name.startswith("Scan In-memory table"):  # an InMemoryTableScanExec
        return ("cached", leaf.relation().cacheBuilder().tableName().get())
    return None


def leaf_key(frame: DataFrame) -> LeafKey:
    """The key of the leaf a frame reads (under the coalesce that puts it in one partition)."""
    plan = analyzed(frame)
    while plan.nodeName() == "Repartition":
        plan = plan.child()
    key = key_of(plan)
    assert key is not None, f"not a leaf frame: {plan.nodeName()}"
    return key


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


# The names of physical leaves of no data of a batch's: a constant relation's, `spark.range`'s.
_CONSTANT_SCANS = frozenset({"LocalTableScan", "Range"})


def _keyed(plan: JavaObject) -> list[tuple[JavaObject, LeafKey | None]]:
    return [(leaf, key_of(leaf)) for leaf in leaves(plan)]


def occurrences(plan: JavaObject) -> list[Occurrence]:
    """The leaves of `plan` that `rebind` (or `replace_leaves`) can replace."""
    return [Occurrence(leaf, key, leaf.output()) for leaf, key in _keyed(plan) if key is not None]


def reads_subqueries(spark: SparkSession, plan: JavaObject) -> bool:
    """Whether an expression of `plan` (any node of it) holds a plan of its own (a scalar
    subquery, say): Spark's transforms (`replace_leaves`, `rebind`) do not reach into those
    plans, so their leaves cannot be rebound."""
    return plan.containsPattern(jvm_of(spark).plan_expression)


def scans(plan: JavaObject) -> list[Occurrence] | None:
    """The scans of the physical `plan` that `replace_leaves` can replace; None when it has
    another leaf than those and constants (one the engine did not make: none to rebind)."""
    keyed = _keyed(plan)
    if any(key is None and leaf.nodeName() not in _CONSTANT_SCANS for leaf, key in keyed):
        return None
    return [Occurrence(leaf, key, leaf.output()) for leaf, key in keyed if key is not None]


Replacement = Callable[[Occurrence], JavaObject]  # a leaf -> the node to put there


def replace_leaves(spark: SparkSession, plan: JavaObject,
                   pairs: Iterable[tuple[JavaObject, JavaObject]]) -> JavaObject:
    """`plan` with each leaf equal to the first of a pair replaced by the second. The nodes
    above a new leaf are copies (Spark's transform), so nothing of an execution of a physical
    plan (a shuffle, metrics) carries over to the next."""
    replace = jvm_of(spark).empty_map
    for old, new in pairs:
        replace = replace.updated(old, new)
    return plan.transformUp(replace)


def rebind(spark: SparkSession, plan: JavaObject, found: Sequence[Occurrence],
           bindings: Mapping[LeafKey, Replacement]) -> JavaObject:
    """The logical `plan` with each occurrence in `found` replaced through `bindings` (every
    key must be bound), marked analyzed: its nodes were, and the new leaves keep the
    attributes."""
    rebound = replace_leaves(spark, plan, [(o.node, bindings[o.key](o)) for o in found])
    rebound.setAnalyzed()
    return rebound


def optimized(frame: DataFrame) -> JavaObject:
    return frame._jdf.queryExecution().optimizedPlan()


def physical_plan(frame: DataFrame) -> JavaObject:
    """The physical plan Spark's planner made of `frame`, before its preparation (exchanges)."""
    return frame._jdf.queryExecution().sparkPlan()


def frame_over(spark: SparkSession, logical: JavaObject, physical: JavaObject) -> DataFrame:
    """A frame whose physical plan is `physical`, taken as it is: Spark's planner plans a
    `LogicalQueryStage` (what adaptive execution wraps its finished stages in) as its physical
    plan, so the frame's optimization and planning are those of one leaf; `logical`, a leaf of
    `physical`'s attributes, gives them. Spark still prepares `physical` for execution
    (exchanges where partitionings do not meet) as it does every plan."""
    stage = jvm_of(spark).query_stage(logical, physical)
    stage.setAnalyzed()  # a leaf of resolved attributes: nothing for the analyzer to do
    return frame_of(spark, stage)


def rows_scan(spark: SparkSession, rdd: JavaObject, clustering: Clustering | None = None
              ) -> Replacement:
    """A physical scan of `rdd` (rows) in place of a recorded leaf, with its attributes."""
    return lambda occ: rdd_scan(spark, occ.output, rdd, clustering)


def cached_scan(spark: SparkSession, relation: JavaObject) -> Replacement:
    """A physical scan of the cached `relation` in place of a recorded leaf, under its
    attributes."""
    j = jvm_of(spark)
    return lambda occ: j.in_memory_scan(occ.output, j.nil, relation.withOutput(occ.output))
