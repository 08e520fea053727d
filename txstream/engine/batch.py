"""A batch being planned: what its one Spark job must compute besides the outputs.

Operators describe their work here without running anything: the state versions they stage,
the frames several consumers share. The engine then materializes it all in one action and
installs the staged versions only when that action succeeded. The batch also
records each frame it materializes with the plan it comes from, in order, which is what a
`txstream.engine.templates.Template` is made of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import DataFrame, SparkSession

from txstream.engine.consolidation import consolidate
from txstream.engine.frames import col
from txstream.engine.runs import Merge, Run
from txstream.engine.spark_internals import (
    Clustering,
    cached_relation,
    cached_rows,
    frame_of,
    rdd_leaf,
)
from txstream.engine.state import StagedRuns, ZSetState


@dataclass(frozen=True)
class Materialization:
    """A frame the batch computes once (`shared`) or keeps as a state's new run (`run`), and the
    leaf that reads it."""

    kind: Literal["shared", "run"]
    source: DataFrame
    leaf: DataFrame
    state: ZSetState | None = None
    clustering: Clustering | None = None  # a shared frame's, declared by its leaf


@dataclass
class BatchPlan:
    spark: SparkSession
    # Rows of input in the batch: the weight of the runs it stages (see `runs.Merge`).
    weight: int
    # The partitions the batch is planned for: the engine's parallelism P, or 1 for a small
    # batch (see txstream.engine.engine); every plan of the batch is given it from here.
    parallelism: int
    staged: list[StagedRuns] = field(default_factory=list)
    materialized: list[Materialization] = field(default_factory=list)
    # The leaves of merged runs, each with its state.
    merged: list[tuple[DataFrame, ZSetState]] = field(default_factory=list)
    # Frames known to be hash-partitioned into `parallelism` partitions, by id: the frame and
    # its columns (the frame is held so that its id stays its own).
    _clustered: dict[int, tuple[DataFrame, tuple[str, ...]]] = field(default_factory=dict)
    # Frames clustered here, by the id of the frame and the columns: (that frame, the result).
    _exchanged: dict[tuple[int, tuple[str, ...]], tuple[DataFrame, DataFrame]] = field(
        default_factory=dict)

    def append(self, state: ZSetState, delta: DataFrame) -> None:
        """Stage `delta` (the state's key and weight columns, any others ignored) into
        `state`'s next version."""
        # Typed first: the first rows fix the state's row type.
        changes = state.typed(self.clustered(delta, state.partition_on))
        merge = Merge.of(state.runs, self.weight)
        merged = state.leaf(self.spark, merge.merged, self.parallelism)
        self.merged.append((merged, state))
        source = state.staged_frame(changes, merged, self.parallelism)
        run = state.checkpoint(source, self.parallelism)
        self.materialized.append(Materialization("run", source, run, state))
        self.staged.append(StagedRuns(state, (*merge.kept, Run(run, merge.new_weight))))

    def clustered(self, frame: DataFrame, columns: list[str]) -> DataFrame:
        """`frame` hash-partitioned by `columns` into the batch's partitions, as a state
        looked up or merged by those columns is (unchanged at parallelism 1, or when `frame`
        already is). Exchanged once per batch whatever the number of its readers (a shared
        frame), so that a join, a state's lookup and its new run read the same exchange.
        Spark keeps a union's partitioning only when each input has it before the planner
        adds exchanges: a delta that meets state in a union is clustered here, explicitly."""
        key = tuple(columns)
        if self.parallelism == 1 or self.clustering_of(frame) == key:
            return frame
        if (id(frame), key) not in self._exchanged:
            leaf = self.shared(frame.repartition(self.parallelism, *[col(c) for c in columns]),
                               clustered_by=columns)
            self._exchanged[id(frame), key] = (frame, leaf)
        return self._exchanged[id(frame), key][1]

    def clustering_of(self, frame: DataFrame) -> tuple[str, ...] | None:
        """The columns `frame` is known to be clustered by (see `clustered`), if any."""
        known = self._clustered.get(id(frame))
        return known[1] if known is not None else None

    def declared(self, leaf: DataFrame, columns: Sequence[str]) -> DataFrame:
        """`leaf`, which declares itself hash-partitioned by `columns` into the batch's
        partitions (a source's changes split on the driver), known to be clustered so."""
        self._clustered[id(leaf)] = (leaf, tuple(columns))
        return leaf

    def keeps(self, frame: DataFrame, *inputs: DataFrame) -> DataFrame:
        """`frame`, known from now on to be clustered as its `inputs` are, when they all are
        by the same columns and `frame` has columns of those names: the caller's word that it
        passes them on unchanged (a filter, a projection keeping them, a union: Spark keeps a
        union's partitioning when its inputs report the same). A reader clustering it then
        adds no exchange of its own; should Spark not see the partitioning, its planner
        exchanges as a join or aggregate needs, and a shared frame declares only what Spark's
        plan shows (`shared`), so the word given here can cost a shuffle but never a wrong
        result."""
        found = {self.clustering_of(f) for f in inputs}
        key = found.pop() if len(found) == 1 else None
        if self.parallelism > 1 and key is not None and set(key) <= set(frame.columns):
            self._clustered[id(frame)] = (frame, key)
        return frame

    def consolidated(self, frame: DataFrame, columns: list[str],
                     readers_cluster_by: Sequence[tuple[str, ...]]) -> DataFrame:
        """`consolidate(frame, columns)`. A partitioning by some of the grouped columns serves
        a consolidation: at parallelism above 1 a frame known to be clustered so is
        consolidated where it is; another is exchanged by the columns a reader of the result
        clusters it by (the first of `readers_cluster_by` among `columns`) rather than by
        every column, so the one exchange serves both the consolidation and the reader."""
        known = self.clustering_of(frame)
        if known is not None and set(known) <= set(columns):
            # Clustered by some of the grouped columns already: consolidated in place.
            return self.keeps(consolidate(frame, columns), frame)
        by = next((b for b in readers_cluster_by if set(b) <= set(columns)), None)
        if self.parallelism == 1 or by is None:
            return consolidate(frame, columns)
        clustered = self.clustered(frame, list(by))
        return self.keeps(consolidate(clustered, columns), clustered)

    def shared(self, frame: DataFrame, clustered_by: Sequence[str] | None = None) -> DataFrame:
        """A frame several plans read: computed once, by the batch's job, and seen by those
        plans as a leaf, kept in memory (columnar, as `DataFrame.cache` keeps it) and read from
        there by every consumer, which neither re-analyzes nor recomputes its lineage.

        What `localCheckpoint(eager=False)` gives, for a sixth of the driver's time: a
        checkpoint is an action of its own (a new SQL execution, a closure cleaned, an
        encoder resolved). The relation keeps its lineage, so it serves frames of one batch
        only; unreferenced, its blocks are freed by Spark's context cleaner. It reports the
        partitioning of its plan, so joins with it need no exchange. `clustered_by`: the
        columns `frame` is hash-partitioned by (at parallelism above 1), if any; the leaf then
        reads the relation's rows and declares that partitioning as a state's leaf does, by
        the columns and by their struct (`spark_internals.rdd_node`), so that a null-safe
        lookup of its keys in a state (`frames.semi_join`) exchanges nothing either."""
        relation = cached_relation(frame)
        wanted: Clustering | None = None
        if clustered_by is not None and self.parallelism > 1:
            names = frame.columns
            wanted = (tuple(names.index(c) for c in clustered_by), self.parallelism)
        # Declared only as Spark's plan of it is partitioned: `keeps` may have been told of a
        # clustering Spark's planner did not keep.
        rows = cached_rows(self.spark, relation, wanted)
        clustering = wanted if rows is not None else None
        leaf = (rdd_leaf(self.spark, relation.output(), rows, clustering) if rows is not None
                else frame_of(self.spark, relation))
        self.materialized.append(Materialization("shared", frame, leaf, clustering=clustering))
        if clustered_by is not None:  # the caller's word: see `clustered`
            self._clustered[id(leaf)] = (leaf, tuple(clustered_by))
        return leaf

    @property
    def frames(self) -> list[DataFrame]:
        """The frames the batch's job must compute although no output shows them."""
        return [s.new for s in self.staged]
