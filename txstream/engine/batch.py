"""A batch being planned: what its one Spark job must compute besides the outputs.

Operators describe their work here without running anything: the state versions they stage,
the frames several consumers share. The engine then materializes it all in one action and
installs the staged versions only when that action succeeded. The batch also
records each frame it materializes with the plan it comes from, in order, which is what a
`txstream.engine.templates.Template` is made of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import DataFrame, SparkSession

from txstream.engine.spark_internals import cached_relation, frame_of
from txstream.engine.state import Run, StagedRuns, ZSetState


@dataclass(frozen=True)
class Materialization:
    """A frame the batch computes once (`shared`) or keeps as a state's new run (`run`), and the
    leaf that reads it."""

    kind: Literal["shared", "run"]
    source: DataFrame
    leaf: DataFrame
    state: ZSetState | None = None


@dataclass
class BatchPlan:
    spark: SparkSession
    # Rows of input in the batch: the weight of the runs it stages (see ZSetState.merge).
    weight: int
    staged: list[StagedRuns] = field(default_factory=list)
    materialized: list[Materialization] = field(default_factory=list)
    # The leaves of merged runs, each with its state.
    merged: list[tuple[DataFrame, ZSetState]] = field(default_factory=list)

    def append(self, state: ZSetState, delta: DataFrame) -> None:
        """Stage `delta` (the state's key and weight columns, any others ignored) into
        `state`'s next version."""
        changes = state.typed(delta)  # first: the first rows fix the state's row type
        merge = state.merge(self.weight)
        merged = state.leaf(self.spark, merge.merged)
        self.merged.append((merged, state))
        source = state.staged_frame(changes, merged)
        # Lazy: computed, and its lineage cut, by the batch's job.
        run = source.localCheckpoint(eager=False)
        self.materialized.append(Materialization("run", source, run, state))
        self.staged.append(StagedRuns(state, (*merge.kept, Run(run, merge.new_weight))))

    def shared(self, frame: DataFrame) -> DataFrame:
        """A frame several plans read: computed once, by the batch's job, and seen by those
        plans as a leaf, kept in memory (columnar, as `DataFrame.cache` keeps it) and read from
        there by every consumer, which neither re-analyzes nor recomputes its lineage.

        What `localCheckpoint(eager=False)` gives, for a sixth of the driver's time: a
        checkpoint is an action of its own (a new SQL execution, a closure cleaned, an
        encoder resolved). The relation keeps its lineage, so it serves frames of one batch
        only; unreferenced, its blocks are freed by Spark's context cleaner. It reports the
        single partition of its plan, so joins with it need no exchange."""
        leaf = frame_of(self.spark, cached_relation(frame))
        self.materialized.append(Materialization("shared", frame, leaf))
        return leaf

    @property
    def frames(self) -> list[DataFrame]:
        """The frames the batch's job must compute although no output shows them."""
        return [s.new for s in self.staged]
