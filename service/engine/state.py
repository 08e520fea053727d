"""Operator state: Z-sets held in Spark as a few consolidated runs (a log-structured merge),
in versions.

A batch stages its consolidated delta as a new run, weighed by the batch's size; a run is
merged into the one before it while that one weighs no more than what is being merged (size
tiers, a binary counter when batches are equal). Each row is rewritten O(log) times, the number
of runs stays logarithmic, and a small batch never rewrites a large state: appending costs
O(delta) amortized, not O(state).

A state's value is an immutable tuple of runs (a version). Staging builds the next version's
plan without running anything; the engine materializes every staged run of a batch in the
batch's one Spark job and only then installs the new versions, so a failed batch leaves every
state as it was, and an older version stays readable (for a checkpoint) while later batches
run. Runs are lazy local checkpoints: computed once, by the job that first reads them, then
read from Spark's memory with their lineage cut, so plans do not grow with the number of
batches. Runs live in one partition, like every frame of a batch: see `service.engine.engine`.

A plan reads a state as one leaf, whatever its number of runs: a `LogicalRDD` over the union of
the runs' RDDs (`service.engine.leaves`), so a batch's plans have the same shape from one batch
to the next and can be rebound to the next version's runs instead of built again
(`service.engine.templates`). For that, every run holds its rows in the state's one row type
(`row_type`): decimals sum to precision 38 at once instead of widening with each merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, StructField, StructType

from service.engine.frames import col, semi_join, union_all
from service.engine.leaves import analyzed, rdd_leaf, rdd_of, union_rdd


@dataclass(frozen=True)
class Run:
    frame: DataFrame  # a local checkpoint: its plan is a LogicalRDD
    weight: int  # rows of input the run summarizes (an estimate of its size, never counted)

    @cached_property
    def rdd(self) -> JavaObject:
        return rdd_of(self.frame)


Runs = tuple[Run, ...]


@dataclass(frozen=True)
class Merge:
    """What adding a batch of `weight` rows does to a version: its runs split into those kept
    and those merged with the batch's changes into one new run of `new_weight`."""

    kept: Runs
    merged: Runs
    new_weight: int


@dataclass(frozen=True)
class StagedRuns:
    """A state's next version, planned but not yet computed: `new` is the frame to
    materialize, `runs` the version to install once it is."""

    state: ZSetState
    runs: Runs

    @property
    def new(self) -> DataFrame:
        return self.runs[-1].frame


def _row_type(schema: StructType) -> StructType:
    """Decimals at precision 38, the bound their sums widen to, so a merge keeps the type."""
    return StructType([StructField(f.name, DecimalType(38, f.dataType.scale)
                                   if isinstance(f.dataType, DecimalType) else f.dataType, True)
                       for f in schema.fields])


class ZSetState:
    """Rows `keys + weights`; the collection is the sum of the weights of equal keys.

    `empty_when` is a SQL predicate on the summed weights that says a key holds nothing (for
    group accumulators: the row count is 0 even if other accumulators are not). It is applied
    when the collection is read whole (a lookup, a save), never to a run: a partial run keeps
    any non-zero weight, and a merge is the same plan whatever runs it merges. A key that
    holds nothing but an inexact residue (a double sum beyond the exact range) so stays in
    the runs until saved, never seen.
    """

    def __init__(self, keys: Sequence[str], weights: Sequence[str], empty_when: str | None = None
                 ) -> None:
        self.keys = list(keys)
        self.weights = list(weights)
        self._empty_when = empty_when
        self.runs: Runs = ()
        # Fixed by the first rows the state gets: every run holds this type.
        self.row_type: StructType | None = None
        self._prototype: JavaObject | None = None  # attributes of `row_type`
        self._leaf: tuple[Runs, DataFrame] | None = None

    def _consolidate(self, frame: DataFrame, whole: bool) -> DataFrame:
        summed = frame.groupBy(*[col(k) for k in self.keys]).agg(
            *[F.sum(col(w)).alias(w) for w in self.weights]
        )
        nonzero = " OR ".join(f"`{w}` != 0" for w in self.weights)
        summed = summed.where(nonzero)
        if whole and self._empty_when:
            summed = summed.where(f"NOT ({self._empty_when})")
        return summed

    def typed(self, frame: DataFrame) -> DataFrame:
        """`frame`'s `keys + weights` in the state's row type (fixed here the first time)."""
        if self.row_type is None:
            self.row_type = _row_type(frame.select(*[col(c) for c in self.keys + self.weights])
                                      .schema)
            self._prototype = analyzed(frame.sparkSession.createDataFrame(
                [], self.row_type)).output()
        return frame.select(*[col(f.name).cast(f.dataType).alias(f.name)
                              for f in self.row_type.fields])

    def leaf(self, spark: SparkSession, runs: Runs) -> DataFrame:
        """The rows of `runs` (none: no rows) as one leaf in one partition, unconsolidated."""
        assert self._prototype is not None, "typed() fixes the row type before any leaf"
        return rdd_leaf(spark, self._prototype, union_rdd(spark, [r.rdd for r in runs])) \
            .coalesce(1)

    def merge(self, weight: int) -> Merge:
        """The runs a batch of `weight` input rows merges with (size tiers: a run merges into
        the one before it while that one weighs no more than what is being merged)."""
        runs = list(self.runs)
        weight = max(1, weight)
        merged: list[Run] = []
        while runs and runs[-1].weight <= weight:
            run = runs.pop()
            merged.insert(0, run)
            weight += run.weight
        return Merge(tuple(runs), tuple(merged), weight)

    def staged_frame(self, changes: DataFrame, merged: DataFrame) -> DataFrame:
        """A new run: the batch's `changes` (`typed`, not necessarily consolidated) plus the
        `merged` runs (a `leaf`), consolidated."""
        return self.typed(self._consolidate(union_all([changes, merged]), whole=False))

    def install(self, runs: Runs) -> None:
        self.runs = runs

    def frame(self) -> DataFrame | None:
        """The current version's rows as one leaf, unconsolidated: equal keys may appear in
        several runs (sum their weights)."""
        if not self.runs:
            return None
        if self._leaf is None or self._leaf[0] is not self.runs:
            self._leaf = (self.runs, self.leaf(self.runs[0].frame.sparkSession, self.runs))
        return self._leaf[1]

    def consolidated(self, runs: Runs) -> DataFrame | None:
        if not runs:
            return None
        return self._consolidate(self.leaf(runs[0].frame.sparkSession, runs), whole=True)

    def lookup(self, probe: DataFrame, on: Sequence[str]) -> DataFrame | None:
        """The consolidated rows whose `on` columns equal (nulls equal) a row of `probe`."""
        whole = self.frame()
        if whole is None:
            return None
        return self._consolidate(semi_join(whole, probe, on), whole=True)

    def save(self, path: str, runs: Runs) -> None:
        """Write a version's consolidated collection as Parquet under `path` (any
        Hadoop-compatible location Spark can write)."""
        whole = self.consolidated(runs)
        if whole is not None:
            whole.write.parquet(path)

    def load(self, spark: SparkSession, path: str | None) -> None:
        """Replace the collection with the one saved at `path` (None: empty). The data is
        copied into Spark's memory, so the files may be deleted afterwards."""
        self.runs = ()
        if path is not None:
            frame = self.typed(spark.read.parquet(path))
            loaded = frame.coalesce(1).localCheckpoint(eager=True)
            # Weighed by its size, so small batches after a restore do not rewrite it.
            self.runs = (Run(loaded, loaded.count()),)
