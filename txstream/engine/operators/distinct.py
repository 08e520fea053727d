"""Distinct: a row is in the output while its multiplicity is positive.

Delta rule: for each row the batch touches, its multiplicity before the batch (from state) plus
the running sum of its diffs in time order; emit +1 where it rises above 0, -1 where it falls
to 0. State: the input's Z-set.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.frames import col
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.state import ZSetState

# A row's multiplicity after each of its changes (a running sum over its timeline).
_AFTER = "__after"


class DistinctOp(Operator):
    def _resolve(self) -> StructType:
        names = self.input_schemas[0].names
        self.state = ZSetState(names, [DIFF], lookup=names, placement=self.placement)
        return self.input_schemas[0]

    def states(self) -> dict[str, ZSetState]:
        return {"state": self.state}

    def key(self, inputs: Sequence[Key]) -> Key:
        """Every column: the output holds each row once."""
        return tuple(self.columns)

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [tuple(self.columns)]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        cols = self.columns
        d = batch.clustered(d, cols)  # at P > 1 partitioned as the state is
        before = self.state.lookup(d, cols, batch.parallelism)
        timeline = d.select(*[col(c) for c in cols], col(TIME), col(DIFF))
        if before is not None:
            timeline = timeline.unionByName(before.withColumn(TIME, F.lit(BEFORE_BATCH)))
        w = (Window.partitionBy(*[col(c) for c in cols]).orderBy(col(TIME))
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
        counted = timeline.withColumn(_AFTER, F.sum(col(DIFF)).over(w))
        crossings = counted.where(
            (col(TIME) != BEFORE_BATCH)
            & ((col(_AFTER) > 0) != ((col(_AFTER) - col(DIFF)) > 0))
        ).select(
            *[col(c) for c in cols], col(TIME),
            F.when(col(_AFTER) > 0, F.lit(1)).otherwise(F.lit(-1)).cast("long").alias(DIFF),
        )
        batch.append(self.state, d)
        return crossings
