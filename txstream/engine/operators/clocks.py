"""The clock of a temporal operator: the largest of some time so far, moved transaction by
transaction within a batch and kept in state between batches (`BehaviorOp` and `SessionOp`:
the largest event time of their input's rows; `NowFilterOp`: the largest wall time).

The rule: given the batch's largest time per transaction (`peaks`), the clock after each
transaction is the running maximum over the batch's transactions in order, started from the
clock before the batch (the state's one row, at `BEFORE_BATCH`); `BEFORE` is the clock before
each transaction. After the batch the state holds the clock after its last transaction.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.frames import col, union_all
from txstream.engine.state import StatePlacement, ZSetState

# The clock's column in saved state (a new name would make earlier checkpoints unreadable),
# and the clock before a transaction, within a batch's plans.
CLOCK, BEFORE = "__clock", "__before"


def clock_state(placement: StatePlacement) -> ZSetState:
    """The state of a clock: one row, its value."""
    return ZSetState([CLOCK], [DIFF], placement=placement)


def running(peaks: DataFrame, before: DataFrame | None, batch: BatchPlan) -> DataFrame:
    """(TIME, CLOCK, BEFORE): the clock after each transaction of `peaks` (TIME, CLOCK: the
    batch's largest time per transaction) and before it, and at BEFORE_BATCH the clock
    `before` the batch (the state's rows, None: no clock yet). Shared: plans read it often."""
    if before is not None:
        peaks = peaks.unionByName(before.select(F.lit(BEFORE_BATCH).cast("long").alias(TIME),
                                                col(CLOCK)))
    so_far = Window.orderBy(col(TIME)).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    clocks = peaks.select(col(TIME), F.max(col(CLOCK)).over(so_far).alias(CLOCK))
    return batch.shared(clocks.select(
        "*", F.lag(col(CLOCK)).over(Window.orderBy(col(TIME))).alias(BEFORE)))


def advance(state: ZSetState, before: DataFrame | None, clocks: DataFrame, batch: BatchPlan
            ) -> None:
    """Stage into `state` the clock after the batch's last transaction, for the old one."""
    old = [before.select(col(CLOCK), (-col(DIFF)).alias(DIFF))] if before is not None else []
    batch.append(state, union_all(
        [*old, clocks.agg(F.max(col(CLOCK)).alias(CLOCK))
         .select(col(CLOCK), F.lit(1).cast("long").alias(DIFF))], batch.parallelism))
