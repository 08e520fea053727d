"""Unmatched rows: a join side's rows while they have no pair in the join's output, the outer part
of a left, right or outer interval join.

    side's rows ----------------> [ per row: V shown, c pairs | closed rows leave ] --> pad
    the join's pairs (its columns) ---^

The rule, per row r of the side: V(r), its multiplicity as the join shows it, and c(r), the
number of the join's output pairs that hold it, both integrated up to the transaction. The
output holds r with multiplicity V(r) while c(r) = 0, and not at all otherwise.

Without a behavior V is the side's Z-set. After a temporal behavior (`txstream.engine.operators.
behavior`) a row's `FATE` says what it is: V sums the rows the join pairs (`COUNTS`, `SHOWN`),
so a row forgotten with `keep_results=True` is still shown, and so are the pairs it made; a
row retracted at close (`keep_results=False`) leaves V and, with it, its padding. Which rows a
row paired with before it was forgotten is what the join's output says: "unmatched" means no
pair in the output, the kept pairs included. (A row deleted while a pair of it stays, its
partner forgotten first, has V = 0 and c > 0: not shown, and not padded if shown again.)

Under a cutoff a row is closed once the side's clock (the largest time of its rows, as its
behavior's) reaches its time plus the cutoff. A closed row is frozen: a change of it is late,
so V stays; it left the join's state, so it makes no pair any more and loses none (a pair
leaves by a retraction of one of its rows in the join's state, or by a close with
`keep_results=False`, which forgets nothing). Its padding is what it is then, for good: the
state forgets the row after the batch that closes it, whatever V and c are (a deleted row's
(0, c) included, of which its behavior says nothing at its close).

Delta rule: for each row the batch touches, V and c before the batch (state) plus the running
sums of its changes in time order; at each transaction, emit f(after) - f(before) where
f(V, c) = V if c = 0 else 0. State: (V, c) per row not closed, looked up by the join's keys
(where the side's changes and the pairs are clustered at P > 1); under a cutoff read whole
each batch, to find the rows it closes (bounded by the rows open), and the clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.frames import col, union_all
from txstream.engine.nodes import UnmatchedNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import COUNTS, FATE, SHOWN, fated, rows_of
from txstream.engine.operators.clocks import CLOCK, advance, clock_state, running
from txstream.engine.state import ZSetState
from txstream.engine.temporal import event_micros

# Per row and transaction: the change of its pairs' count (DIFF is that of V); over its
# timeline, V and c after each change; the clock after the batch.
_PAIRS = "__pairs"
_SHOWN_AFTER, _PAIRS_AFTER, _FINAL = "__shown_after", "__pairs_after", "__final_clock"


class UnmatchedOp(Operator):
    node: UnmatchedNode
    # Its changes are summed by row and transaction.
    reads_unconsolidated = True

    def _resolve(self) -> StructType:
        side, pairs = self.input_schemas
        self.fated = fated(side)
        rows = rows_of(side)
        self._require(pairs, rows.names, "the join's output lacks the side's")
        # Under a cutoff the state is read whole each batch, to find the rows it closes: it is
        # never looked up by key, so never indexed (a looked-up state's indexed runs are read
        # only by key).
        self.state = ZSetState(rows.names, [DIFF, _PAIRS],
                               lookup=self.node.on if self.node.cutoff is None else None,
                               placement=self.placement)
        self.clock = (clock_state(self.placement) if self.node.cutoff is not None else None)
        return rows

    def states(self) -> dict[str, ZSetState]:
        return {"state": self.state} | ({"clock": self.clock} if self.clock is not None else {})

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
            shown = col(FATE).isin(COUNTS, SHOWN) if self.fated else F.lit(True)
            parts.append(batch.keeps(side.where(shown).select(
                *rows, col(TIME), col(DIFF), no.alias(_PAIRS)), side))
        if pairs is not None:
            pairs = batch.clustered(pairs, on)
            parts.append(batch.keeps(pairs.select(*rows, col(TIME), no.alias(DIFF),
                                                  col(DIFF).alias(_PAIRS)), pairs))
        changes = batch.keeps(union_all(parts, planned), *parts) \
            .groupBy(*rows, col(TIME)).agg(F.sum(col(DIFF)).alias(DIFF),
                                            F.sum(col(_PAIRS)).alias(_PAIRS))
        changes = batch.shared(changes, clustered_by=on if planned > 1 else None)

        timeline = [changes]
        if self.state.lookup_on is not None:
            before = self.state.lookup(changes, on, planned)
        else:
            whole = self.state.whole(planned)
            before = batch.shared(whole) if whole is not None else None
        if before is not None:
            timeline.append(before.select(*rows, F.lit(BEFORE_BATCH).cast("long").alias(TIME),
                                          col(DIFF), col(_PAIRS)))
        running_sum = (Window.partitionBy(*rows).orderBy(col(TIME))
                       .rowsBetween(Window.unboundedPreceding, Window.currentRow))
        counted = union_all(timeline, planned).select(
            *rows, col(TIME), col(DIFF), col(_PAIRS),
            F.sum(col(DIFF)).over(running_sum).alias(_SHOWN_AFTER),
            F.sum(col(_PAIRS)).over(running_sum).alias(_PAIRS_AFTER))
        counted = batch.shared(counted, clustered_by=on if planned > 1 else None)

        after = _padded(col(_SHOWN_AFTER), col(_PAIRS_AFTER))
        earlier = _padded(col(_SHOWN_AFTER) - col(DIFF), col(_PAIRS_AFTER) - col(_PAIRS))
        out = counted.where(col(TIME) != BEFORE_BATCH).select(
            *rows, col(TIME), (after - earlier).alias(DIFF)).where(col(DIFF) != 0)
        kept = batch.keeps(counted.where(col(TIME) != BEFORE_BATCH)
                           .select(*rows, col(DIFF), col(_PAIRS)), counted)
        batch.append(self.state, self._state_changes(kept, before, side, batch)
                     if side is not None else kept)
        return self._output(batch.keeps(out, counted), batch)

    def _state_changes(self, kept: DataFrame, held: DataFrame | None, side: DataFrame,
                       batch: BatchPlan) -> DataFrame:
        """The state's changes: the batch's changes `kept` of rows still open after it, and the
        rows the batch closes taken out of the state `held` before it (under a cutoff, by the
        clock the `side`'s rows move; without one, `kept`)."""
        cutoff = self.node.cutoff
        if self.clock is None or cutoff is None:
            return kept
        planned = batch.parallelism
        at = F.expr(event_micros(f"`{self.node.time}`", self.node.timed))
        before = self.clock.whole(planned)
        clocks = running(side.groupBy(col(TIME)).agg(F.max(at).alias(CLOCK)), before, batch)
        advance(self.clock, before, clocks, batch)
        final = F.broadcast(clocks.agg(F.max(col(CLOCK)).alias(_FINAL)))

        def closed(frame: DataFrame, which: bool) -> DataFrame:
            """`frame`'s rows closed after the batch (`which`), or those still open (a row
            without a time never closes)."""
            shut = F.coalesce(at + F.lit(cutoff) <= col(_FINAL), F.lit(False))
            return batch.keeps(frame.crossJoin(final).where(shut if which else ~shut)
                               .drop(_FINAL), frame)

        parts = [closed(kept, False)]
        if held is not None:
            parts.append(closed(held, True).select(
                *[col(c) for c in self.columns], (-col(DIFF)).alias(DIFF),
                (-col(_PAIRS)).alias(_PAIRS)))
        return batch.keeps(union_all(parts, planned), *parts)


def _padded(shown: Column, pairs: Column) -> Column:
    """f(V, c): a row's multiplicity in the output, V while it has no pair."""
    return F.when(pairs == 0, shown).otherwise(F.lit(0).cast("long"))
