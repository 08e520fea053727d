"""As-of-now join: each row inserted on the left with the right side as it stands at its
transaction, once (Pathway's `asof_now_join`).

    left rows  ----> [ insertions only ] --+--> [ per inserted row: its key's right rows at t ]
    right rows ----> [ state, by key ] ----+        --> on columns, left's others, right's others

The rule: a left row inserted at transaction t pairs with every right row of the same `on`
columns present at t (t's own right changes included), a pair's multiplicity the product of
the two, and that pair stays: later right changes do not touch it, nor does the left row's
deletion (an update of a left row is its deletion, ignored, and the insertion of its new
version, paired then). The output is a log of lookups, never retracted. `how="left"` outputs an
inserted row without a partner once, the right's columns null; `inner` drops it. A null `on`
column matches nothing.

Delta rule: with R(t) the right side at t, the change at t is f(insertions of dL(t), R(t)); a
batch of several transactions matches each insertion against the right state before the batch
plus the batch's right changes up to its own transaction. Not linear in the transactions (a
row inserted and deleted in one netted transaction would never be looked up), so a batch is
never computed as one netted transaction (`sees_transactions`).

No output key: each version of a left row stays in the log, and a row may have many partners.
State: the right side's rows, looked up by the `on` columns; the left side keeps none, which is
what this join is for: a stream of lookups (orders priced at the price in force when they
arrived) whose state is only the table looked up.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.frames import build_side, col, join, prefixed, union_all
from txstream.engine.nodes import AsofNowJoinNode
from txstream.engine.operators.base import Clustered, Delta, Operator
from txstream.engine.operators.join import JoinLayout
from txstream.engine.state import ZSetState

# Within one batch's plans: the right side's columns when joined, a right row's multiplicity at
# the probe's transaction, and a probe's partners ranked (the present ones first).
_RIGHT, _HELD, _RANK = "__r_", "__held", "__rank"


class AsofNowJoinOp(Operator):
    node: AsofNowJoinNode
    sees_transactions = True
    multiplies_rows = True  # a left row pairs with every right row of its key

    def _resolve(self) -> StructType:
        left, right = self.input_schemas
        self.layout = JoinLayout(self, left, right, self.node.on)
        on = list(self.node.on) or None
        self.right_state = ZSetState(right.names, [DIFF], lookup=on, placement=self.placement)
        return self.layout.schema

    def states(self) -> dict[str, ZSetState]:
        return {"right_state": self.right_state}

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [tuple(self.node.on) or None] * 2

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d_left, d_right = deltas
        on = list(self.node.on)
        if d_right is not None:
            d_right = batch.shared(batch.clustered(d_right, on) if on else d_right, on or None)
        pairs = None
        if d_left is not None:
            # Read twice: by the state's lookup and by the join.
            d_left = batch.shared(batch.clustered(d_left, on) if on else d_left, on or None)
            left_names = self.input_schemas[0].names
            # Insertions only, each row's changes of one transaction summed first: an update's
            # old version cancels nothing already paired, its new version is looked up.
            probes = (d_left.groupBy(*[col(n) for n in left_names], col(TIME))
                      .agg(F.sum(col(DIFF)).alias(DIFF)).where(col(DIFF) > 0))
            right = [d_right] if d_right is not None else []
            held = self.right_state.lookup(probes, on, batch.parallelism) if on \
                else self.right_state.whole(batch.parallelism)
            if held is not None:
                right.append(held.withColumn(TIME, F.lit(BEFORE_BATCH).cast("long")))
            if not right:  # no right rows yet: every probe is without a partner
                right = [self._empty(StructType([*self.input_schemas[1].fields,
                                                 StructField(TIME, LongType()),
                                                 StructField(DIFF, LongType())]))]
            pairs = self._matched(probes, union_all(right, batch.parallelism), batch)
        if d_right is not None:
            batch.append(self.right_state, d_right)
        return pairs

    def _matched(self, probes: DataFrame, right: DataFrame, batch: BatchPlan) -> DataFrame:
        """Each probe (an inserted left row, its transaction and multiplicity) with the right
        rows present at its transaction; alone, the right's columns null, without one (dropped
        then by an inner join)."""
        lay = self.layout
        left_names = self.input_schemas[0].names
        r = build_side(prefixed(right, _RIGHT))
        cond = reduce(lambda a, b: a & b,
                      [probes[f"`{k}`"] == r[f"`{_RIGHT}{k}`"] for k in lay.on],
                      r[f"`{_RIGHT}{TIME}`"] <= probes[f"`{TIME}`"])
        probe = [col(n) for n in left_names] + [col(TIME), col(DIFF)]
        partner = [col(f"{_RIGHT}{c}") for c in lay.right_rest]
        candidates = (join(probes, r, cond, "left", batch.parallelism)
                      .groupBy(*probe, *partner).agg(F.sum(col(f"{_RIGHT}{DIFF}")).alias(_HELD)))
        present = F.coalesce(col(_HELD) > 0, F.lit(False))
        if self.node.how == "inner":
            kept = candidates.where(present)
        else:  # the present partners, or the probe's one row when it has none
            first = Window.partitionBy(*probe).orderBy(present.desc())
            kept = candidates.select("*", F.row_number().over(first).alias(_RANK)) \
                .where(present | (col(_RANK) == 1))
        return self._output(kept.select(
            *[col(c) for c in lay.on + lay.left_rest],
            *[F.when(present, col(f"{_RIGHT}{c}")).alias(c) for c in lay.right_rest],
            col(TIME),
            (col(DIFF) * F.when(present, col(_HELD)).otherwise(1)).alias(DIFF)), batch)
