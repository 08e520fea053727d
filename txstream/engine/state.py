"""Operator state: a Z-set held in Spark as a few consolidated runs, in versions.

The rule: a state's value is an immutable tuple of runs (a version), replaced whole. Staging
builds the next version's plan without running anything (the batch's changes as a new run,
merged with the runs size tiers say, `txstream.engine.runs`); the engine materializes every
staged run of a batch in the batch's one Spark job and only then installs the new versions, so
a failed batch leaves every state as it was, and an older version stays readable (for a
checkpoint, `txstream.engine.persistence`) while later batches run.

At parallelism 1 runs live in one partition, like every frame of a batch (see
`txstream.engine.engine`). At P > 1 (`StatePlacement.partitions`, given when the state is made)
every run is hash-partitioned into P partitions by the state's lookup columns
(`partition_on`), partition i of each run holding the same keys, and the leaf declares it: a
join or an aggregate by those columns reads each partition where it is, and only the batch's
delta is exchanged to meet it. A run is checked to be so partitioned when it is staged
(`checkpoint`); the declaration is a promise the planner trusts, and a false one would pair
rows that never meet.

A plan reads a state's small runs as one leaf, whatever their number: a `LogicalRDD` over the
union of the runs' RDDs (`txstream.engine.spark_internals`), so a batch's plans have the same
shape from one batch to the next and can be rebound to the next version's runs instead of built
again (`txstream.engine.templates`). For that, every run holds its rows in the state's one row type
(`row_type`): decimal weights sum to precision 38 at once instead of widening with each merge.
A lookup streams those runs and probes the large runs' indexes (`txstream.engine.indexed_runs`
keeps which runs have one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from py4j.java_gateway import JavaObject
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, StructField, StructType

from txstream.engine import run_index
from txstream.engine.errors import EngineStateError
from txstream.engine.frames import (
    build_side,
    col,
    join,
    null_safe_on,
    prefixed,
    semi_join,
    union_all,
)
from txstream.engine.indexed_runs import IndexedRuns
from txstream.engine.runs import Run, Runs, kept
from txstream.engine.spark_internals import (
    Clustering,
    Replacement,
    attributes,
    frame_of,
    hash_clusterings,
    rdd_node,
    rows_scan,
    union_rdd,
)

log = logging.getLogger(__name__)


# The partition number a small batch's new run is split by (see ZSetState._split).
_PARTITION = "__partition"


@dataclass(frozen=True)
class StagedRuns:
    """A state's next version, planned but not yet computed: `new` is the frame to
    materialize, `runs` the version to install once it is."""

    state: ZSetState
    runs: Runs

    @property
    def new(self) -> DataFrame:
        return self.runs[-1].frame


@dataclass(frozen=True)
class StatePlacement:
    """Where every run of a state lives: in `partitions` partitions (the engine's parallelism
    P, see the module doc), each block on `replicas` executors (see `checkpoint`)."""

    partitions: int = 1
    replicas: int = 1


def _row_type(schema: StructType, weights: Sequence[str]) -> StructType:
    """Decimal weights at precision 38, the bound their sums widen to, so a merge keeps the
    type. Keys keep theirs: a decimal of more than 18 digits is a BigDecimal in every row that
    holds it, and each hash, comparison and copy of it builds one (keys are never summed)."""
    return StructType([StructField(f.name, DecimalType(38, f.dataType.scale)
                                   if isinstance(f.dataType, DecimalType) and f.name in weights
                                   else f.dataType, True)
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

    def __init__(self, keys: Sequence[str], weights: Sequence[str], empty_when: str | None = None,
                 lookup: Sequence[str] | None = None, *, placement: StatePlacement) -> None:
        self.keys = list(keys)
        self.weights = list(weights)
        self._empty_when = empty_when
        # The columns every lookup matches on (None: never looked up, never indexed).
        self.lookup_on = list(lookup) if lookup is not None else None
        # The partitions of every run, and the columns they are hashed by (see the module doc).
        self.partitions = placement.partitions
        self.partition_on = self.lookup_on if self.lookup_on is not None else self.keys
        # Copies of each run's blocks on distinct executors (see `checkpoint`).
        self.replicas = placement.replicas
        self.runs: Runs = ()
        # Fixed by the first rows the state gets: every run holds this type.
        self.row_type: StructType | None = None
        self._prototype: JavaObject | None = None  # attributes of `row_type`
        # `row_type`'s columns cast and named, made once: a cast to a type object costs about six
        # round trips to the JVM, and a batch's plans type every delta of every state.
        self._typing: dict[str, Column] = {}  # by column name, in `row_type`'s order
        # The current version's streamed runs as one leaf.
        self._leaf: dict[int, DataFrame] = {}  # by the parallelism of the plans reading it
        # Which of the runs have an index, which lookups probe instead of streaming the run.
        self.indexes = IndexedRuns(self.lookup_on)
        self._splitting: tuple[DataFrame, Column] | None = None  # see _split

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
                                      .schema, self.weights)
            self._prototype = attributes(frame.sparkSession.createDataFrame([], self.row_type))
            self._typing = {f.name: col(f.name).cast(f.dataType).alias(f.name)
                            for f in self.row_type.fields}
        return frame.select(*self._typing.values())

    def _clustering(self) -> Clustering | None:
        if self.partitions == 1:
            return None
        assert self.row_type is not None
        return tuple(self.row_type.names.index(c) for c in self.partition_on), self.partitions

    def _rows(self, spark: SparkSession, runs: Runs) -> tuple[JavaObject, Clustering | None]:
        """The rows of `runs` as one RDD, unconsolidated (at P > 1 partition i of every run in
        partition i), and the clustering a leaf over it declares."""
        clustering = self._clustering()
        rdd = union_rdd(spark, [r.rdd for r in runs], clustering[1] if clustering else 0)
        return rdd, clustering

    def scan(self, spark: SparkSession, runs: Runs) -> Replacement:
        """A physical leaf reading the rows of `runs` in place of a recorded one (a
        template's)."""
        return rows_scan(spark, *self._rows(spark, runs))

    def leaf(self, spark: SparkSession, runs: Runs, planned: int) -> DataFrame:
        """The rows of `runs` (none: no rows) as one leaf, unconsolidated: in the runs' P
        partitions, or in one for a batch `planned` in one (see `txstream.engine.engine`)."""
        assert self._prototype is not None, "typed() fixes the row type before any leaf"
        node = rdd_node(spark, self._prototype, *self._rows(spark, runs))
        leaf = frame_of(spark, node.newInstance())
        return leaf.coalesce(1) if planned == 1 else leaf

    def checkpoint(self, source: DataFrame, planned: int) -> DataFrame:
        """A staged run: `source` (a `staged_frame`, of a batch planned for `planned`
        partitions) as a lazy local checkpoint (computed, and its lineage cut, by the batch's
        job). At P > 1 it must come out hash-partitioned as the state's leaves declare: in a
        batch planned in one partition `staged_frame` split it so; otherwise Spark's
        checkpoint records the partitioning of its physical plan, which is read here, and a
        plan that lost it (an exchange the planner chose by other columns) is repartitioned
        explicitly, which costs a shuffle of the run but never a wrong pair."""
        if self._split_here(planned):
            return self._local_checkpoint(source, eager=False)
        run = self._local_checkpoint(source, eager=False)
        wanted = (list(self.partition_on), self.partitions)
        if self.partitions == 1 or wanted in hash_clusterings(run):
            return run
        log.debug("a staged run of %s lost its hash partitioning: repartitioned",
                  self.partition_on)
        run = self._local_checkpoint(self._hashed(source), eager=False)
        if wanted not in hash_clusterings(run):
            raise EngineStateError(f"a state run is not hash-partitioned by {self.partition_on} "
                                   f"into {self.partitions} partitions: {hash_clusterings(run)}")
        return run

    def _hashed(self, frame: DataFrame) -> DataFrame:
        """`frame` exchanged into the state's P partitions by `partition_on`."""
        return frame.repartition(self.partitions, *[col(c) for c in self.partition_on])

    def _split(self, frame: DataFrame) -> DataFrame:
        """`frame`, planned in one partition (a small batch's), in the state's P partitions as
        `repartition(P, *partition_on)` places its rows, with no exchange: a cartesian product
        with P one-row partitions numbered 0..P-1, partition j of which keeps the rows whose
        key hashes to j. Each of the P tasks reads the one partition (a small batch's new run:
        its delta and the small runs it merges), so the batch stays one stage where an
        exchange per staged run would add as many."""
        if self._splitting is None:  # built once: a lone transaction splits every run anew
            numbers = frame.sparkSession.range(0, self.partitions, 1, self.partitions).select(
                F.col("id").alias(_PARTITION))
            target = F.pmod(F.hash(*[col(c) for c in self.partition_on]),
                            F.lit(self.partitions))
            # Not `target == number`: Spark would plan that equality as an equi-join, which
            # exchanges both sides by the hash of the partition number.
            self._splitting = numbers, (target - F.col(_PARTITION)) == 0
        numbers, keep = self._splitting
        return frame.crossJoin(numbers).where(keep).drop(_PARTITION)

    def _local_checkpoint(self, frame: DataFrame, eager: bool) -> DataFrame:
        """`frame` kept as a run of this state: on `replicas` executors (`runs.kept`)."""
        return kept(frame, self.replicas, eager)

    def staged_frame(self, changes: DataFrame, merged: DataFrame, planned: int) -> DataFrame:
        """A new run: the batch's `changes` (`typed`, not necessarily consolidated; at P > 1
        clustered by `partition_on`, see `BatchPlan.clustered`) plus the `merged` runs (a
        `leaf`), consolidated, for a batch `planned` for that many partitions; at P > 1 in a
        batch planned in one partition, split into the state's P partitions (`_split`), so
        that a template records the split with the rest of the run's plan and a rebound batch
        does not build it again."""
        run = self.typed(self._consolidate(union_all([changes, merged], planned), whole=False))
        return self._split(run) if self._split_here(planned) else run

    def _split_here(self, planned: int) -> bool:
        """Whether a new run is split by `staged_frame` (at P > 1, in a batch `planned` in one
        partition), which `checkpoint` then takes as partitioned."""
        return self.partitions > 1 and planned == 1

    def install(self, runs: Runs) -> None:
        self.runs = runs
        self._leaf = {}

    def replicate(self, rdd_ids: set[int]) -> None:
        """Copy anew the current version's runs of those RDD ids, each block to `replicas`
        executors (one job per run): `txstream.engine.replicas` names the runs with a block on
        fewer executors. A copy holds its run's rows: it keeps the run's index."""
        runs = []
        for run in self.runs:
            if run.rdd_id in rdd_ids:
                copy = Run(self._local_checkpoint(run.frame, eager=True), run.weight)
                self.indexes.copied(run, copy)
                run = copy
            runs.append(run)
        self.install(tuple(runs))

    def streamed(self) -> Runs:
        """The current version's runs without an index: lookups stream their rows."""
        return self.indexes.streamed(self.runs)

    def indexed(self) -> Runs:
        return self.indexes.indexed(self.runs)

    def shape(self) -> tuple[bool, bool]:
        """What a batch's plans depend on: whether runs are streamed, whether any is indexed."""
        return bool(self.streamed()), bool(self.indexed())

    def frame(self, planned: int) -> DataFrame | None:
        """The current version's streamed runs as one leaf for a batch `planned` for that many
        partitions (see `leaf`), unconsolidated: equal keys may appear in several runs (sum
        their weights). The indexed runs are read by `matches`."""
        streamed = self.streamed()
        if not streamed:
            return None
        if planned not in self._leaf:
            self._leaf[planned] = self.leaf(streamed[0].frame.sparkSession, streamed, planned)
        return self._leaf[planned]

    def whole(self, planned: int) -> DataFrame | None:
        """The current version's collection, consolidated, for a batch `planned` for that many
        partitions, or None when it has no runs: for a state never looked up, so never indexed,
        whose streamed runs are all its runs (the leaf a batch's template rebinds, `frame`)."""
        assert self.lookup_on is None, "a looked-up state's indexed runs are read by `matches`"
        frame = self.frame(planned)
        return None if frame is None else self._consolidate(frame, whole=True)

    def index_frame(self) -> DataFrame | None:
        """The files of the current version's indexed runs as a leaf (one row per file, see
        `run_index.FILES_TYPE`), or None when no run is indexed."""
        listed = self.indexes.files(self.runs)
        if listed is None:
            return None
        spark, output, rows = listed
        return frame_of(spark, rdd_node(spark, output, rows).newInstance())

    def index_scan(self) -> Replacement:
        """A physical leaf reading the files of the current indexed runs in place of a
        recorded one (a template's)."""
        listed = self.indexes.files(self.runs)
        assert listed is not None, "a plan reads index files only when some exist"
        spark, _, rows = listed
        return rows_scan(spark, rows)

    def _probe_keys(self, probe: DataFrame) -> DataFrame:
        """The distinct `lookup_on` values of `probe` in the state's types, as `__p_` columns."""
        assert self.lookup_on is not None and self.row_type is not None
        return prefixed(probe.select(*[self._typing[c] for c in self.lookup_on]).distinct(),
                        "__p_")

    def matches(self, probe: DataFrame, planned: int) -> list[DataFrame]:
        """The indexed runs' rows whose lookup columns equal (nulls equal) a row of `probe`,
        unconsolidated (none, or one frame: in a batch `planned` for P > 1 partitions,
        partitioned as the state's leaves are); the streamed runs are left to the caller
        (`frame`)."""
        files = self.index_frame()
        if files is None:
            return []
        assert self.lookup_on is not None and self.row_type is not None
        keys = self._probe_keys(probe).coalesce(1)
        probe_cols = [f"__p_{c}" for c in self.lookup_on]
        candidates = run_index.lookups(keys, probe_cols, files, self.row_type)
        # Both sides in one partition: the join needs no exchange.
        found = join(candidates, build_side(keys),
                     null_safe_on(candidates, keys, self.lookup_on, probe_cols), "inner",
                     planned).select(*[candidates[f"`{c}`"] for c in self.row_type.names])
        return [found.coalesce(1) if planned == 1 else self._hashed(found)]

    def consolidated(self, runs: Runs, planned: int) -> DataFrame | None:
        """The collection `runs` hold, read whole (see `empty_when`) for a plan of `planned`
        partitions; None for no runs."""
        if not runs:
            return None
        if len(runs) == 1 and planned == self.partitions:
            # A run is consolidated already (`txstream.engine.runs`), in the state's partitions:
            # only the keys that hold nothing leave, no aggregate (a stop's checkpoint writes
            # one-run states for most of its time).
            run = runs[0].frame
            return run.where(f"NOT ({self._empty_when})") if self._empty_when else run
        return self._consolidate(self.leaf(runs[0].frame.sparkSession, runs, planned),
                                 whole=True)

    def lookup(self, probe: DataFrame, on: Sequence[str], planned: int) -> DataFrame | None:
        """The consolidated rows whose `on` columns (the state's lookup columns) equal (nulls
        equal) a row of `probe`, for a batch `planned` for that many partitions."""
        assert list(on) == self.lookup_on, f"looked up by {on}, declared {self.lookup_on}"
        whole = self.frame(planned)
        parts = []
        if whole is not None:
            assert self.row_type is not None  # fixed by the rows the runs hold
            # At P > 1 joined on the struct of the lookup columns, by which the leaf declares
            # its partitioning too: state is read in place, only the probe's keys move.
            key_types = StructType([self.row_type[c] for c in on])
            parts.append(semi_join(whole, probe, on, key_types, planned))
        parts += self.matches(probe, planned)
        if not parts:
            return None
        return self._consolidate(union_all(parts, planned), whole=True)

    def refresh_indexes(self, index_rows: int, directory: Callable[[], str]) -> None:
        """Index the current version's runs of at least `index_rows` rows (files under
        `directory()`) and drop the indexes of runs no longer in it (`IndexedRuns.refresh`)."""
        if self.indexes.refresh(self.runs, index_rows, directory):
            self._leaf = {}  # runs moved between streamed and indexed

    def drop_indexes(self) -> None:
        """Delete every index: lookups stream every run."""
        self.indexes.drop()
        self._leaf = {}

    def new_run(self, rows: DataFrame) -> DataFrame:
        """`rows` (the state's keys and weights, consolidated, in any partitioning: a saved
        state's, whatever parallelism saved it) as a run's frame: typed, in the state's
        partitions, a lazy local checkpoint, computed by the first job that reads it."""
        frame = self.typed(rows)
        spread = frame.coalesce(1) if self.partitions == 1 else self._hashed(frame)
        return self._local_checkpoint(spread, eager=False)
