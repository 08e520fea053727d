"""Unmatched rows: a join side's rows while they have no pair in the join's output, the outer
part of a left, right or outer interval join.

    side's rows ----------------> [ per row: V shown, c pairs | forgotten rows leave ] --> pad
    the join's pairs (its columns) ---^

The rule, per row r of the side: V(r), its multiplicity as the join shows it, and c(r), the
number of the join's output pairs that hold it, both integrated up to the transaction. The
output holds r with multiplicity V(r) while c(r) = 0, and not at all otherwise.

Without a behavior V is the side's Z-set. After a temporal behavior (`txstream.engine.operators.
behavior`) a row's `FATE` says what it is: V sums the rows the join pairs (`COUNTS`, `SHOWN`),
so a row forgotten with `keep_results=True` is still shown, and so are the pairs it made; a
row retracted at close (`keep_results=False`) leaves V and, with it, its padding. Which rows a
row paired with before it was forgotten is what the join's output says: "unmatched" means no
pair in the output, the kept pairs included.

A forgotten row (`FORGETS`, or `SHOWN`: shown and forgotten at once) is frozen: it left the
join's state, so it makes no pair any more and loses none (a pair leaves by a retraction of
one of its rows in the join's state, or by a close with `keep_results=False`, which forgets
nothing), and it is not shown again or retracted (a row of its time would be late). Its padding
is what it is then, for good: the state forgets the row after the batch it was forgotten in.

Delta rule: for each row the batch touches, V and c before the batch (state) plus the running
sums of its changes in time order; at each transaction, emit f(after) - f(before) where
f(V, c) = V if c = 0 else 0. State: (V, c) per row, looked up by the join's keys (where the
side's changes and the pairs are clustered at P > 1), without the rows forgotten.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.frames import col, union_all
from txstream.engine.nodes import UnmatchedNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import COUNTS, FATE, FORGETS, SHOWN, fated, rows_of
from txstream.engine.state import ZSetState

# Per row and transaction: the change of its pairs' count (DIFF is that of V), whether it was
# forgotten then; over its timeline, V and c after each change and whether it is forgotten in
# the batch at all.
_PAIRS, _GONE = "__pairs", "__gone"
_SHOWN_AFTER, _PAIRS_AFTER, _GONE_IN_BATCH = "__shown_after", "__pairs_after", "__gone_in_batch"


class UnmatchedOp(Operator):
    node: UnmatchedNode
    # Its changes are summed by row and transaction.
    reads_unconsolidated = True

    def _resolve(self) -> StructType:
        side, pairs = self.input_schemas
        self.fated = fated(side)
        rows = rows_of(side)
        self._require(pairs, rows.names, "the join's output lacks the side's")
        self.state = ZSetState(rows.names, [DIFF, _PAIRS], lookup=self.node.on,
                               placement=self.placement)
        return rows

    def states(self) -> dict[str, ZSetState]:
        return {"state": self.state}

    def key(self, inputs: Sequence[Key]) -> Key:
        """The side's: its unmatched rows are some of its rows."""
        return inputs[0]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        # Both inputs come from the join, clustered by its keys: the state is placed so.
        return [tuple(self.node.on)] * 2

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        """The side's whole rows, and their columns in the join's pairs (which a join would
        otherwise leave null when no reader reads them)."""
        rows = frozenset(self.columns)
        return [frozenset(self.input_schemas[0].names), rows]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        side, pairs = deltas
        if side is None and pairs is None:
            return None
        on, planned = list(self.node.on), batch.parallelism
        rows = [col(c) for c in self.columns]
        no = F.lit(0).cast("long")
        parts = []
        if side is not None:
            side = batch.clustered(side, on)
            shown, gone = self._fates()
            parts.append(batch.keeps(side.where(shown | gone).select(
                *rows, col(TIME), F.when(shown, col(DIFF)).otherwise(no).alias(DIFF),
                no.alias(_PAIRS), gone.alias(_GONE)), side))
        if pairs is not None:
            pairs = batch.clustered(pairs, on)
            parts.append(batch.keeps(pairs.select(*rows, col(TIME), no.alias(DIFF),
                                                  col(DIFF).alias(_PAIRS),
                                                  F.lit(False).alias(_GONE)), pairs))
        changes = batch.keeps(union_all(parts, planned), *parts) \
            .groupBy(*rows, col(TIME)).agg(F.sum(col(DIFF)).alias(DIFF),
                                            F.sum(col(_PAIRS)).alias(_PAIRS),
                                            F.max(col(_GONE)).alias(_GONE))
        changes = batch.shared(changes, clustered_by=on if planned > 1 else None)

        timeline = [changes]
        before = self.state.lookup(changes, on, planned)
        if before is not None:
            timeline.append(before.select(*rows, F.lit(BEFORE_BATCH).cast("long").alias(TIME),
                                          col(DIFF), col(_PAIRS), F.lit(False).alias(_GONE)))
        row = Window.partitionBy(*rows)
        running = row.orderBy(col(TIME)).rowsBetween(Window.unboundedPreceding,
                                                     Window.currentRow)
        counted = union_all(timeline, planned).select(
            *rows, col(TIME), col(DIFF), col(_PAIRS),
            F.sum(col(DIFF)).over(running).alias(_SHOWN_AFTER),
            F.sum(col(_PAIRS)).over(running).alias(_PAIRS_AFTER),
            F.max(col(_GONE)).over(row).alias(_GONE_IN_BATCH))
        counted = batch.shared(counted, clustered_by=on if planned > 1 else None)

        after = _padded(col(_SHOWN_AFTER), col(_PAIRS_AFTER))
        earlier = _padded(col(_SHOWN_AFTER) - col(DIFF), col(_PAIRS_AFTER) - col(_PAIRS))
        out = counted.where(col(TIME) != BEFORE_BATCH).select(
            *rows, col(TIME), (after - earlier).alias(DIFF)).where(col(DIFF) != 0)
        # The state: the batch's changes of the rows it does not forget, and the rows it
        # forgets taken out whole.
        held = col(TIME) != BEFORE_BATCH
        kept = counted.where(held != col(_GONE_IN_BATCH)).select(
            *rows, *[F.when(held, col(c)).otherwise(-col(c)).alias(c) for c in (DIFF, _PAIRS)])
        batch.append(self.state, batch.keeps(kept, counted))
        return self._output(batch.keeps(out, counted), batch)

    def _fates(self) -> tuple[Column, Column]:
        """Whether a change of the side is shown (the join pairs it) and whether it forgets its
        row; without a behavior, every change is shown and none forgets."""
        if not self.fated:
            return F.lit(True), F.lit(False)
        return col(FATE).isin(COUNTS, SHOWN), col(FATE).isin(SHOWN, FORGETS)


def _padded(shown: Column, pairs: Column) -> Column:
    """f(V, c): a row's multiplicity in the output, V while it has no pair."""
    return F.when(pairs == 0, shown).otherwise(F.lit(0).cast("long"))
