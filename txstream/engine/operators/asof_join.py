"""As-of join: each left row with the right row of its key nearest in time (Pathway's
`asof_join`).

    left rows  --+--> [ per left row: its key's right rows as of the transaction, the nearest ]
    right rows --+        --> on columns, the left's other columns, the right's other columns

The rule: at every transaction a left row pairs with the right row of the same `on` columns,
present then, whose time is the greatest at or before the left row's (`backward`), the least at
or after it (`forward`) or the closest (`nearest`, the later of two as close); right rows of
equal time are taken in the order of their other columns, the least first. A row whose time is
null matches nothing. `how="left"` outputs a left row without a partner once, the right's
columns null; `inner` drops it. A pair's multiplicity is the left row's.

Delta rule: the output f(L, R) is linear in the left side, not in the right, so the change at
transaction t is

    f(dL(t), R(t)) + f(L(t-1), R(t)) - f(L(t-1), R(t-1)):

the left changes matched against the right as of t (t's right changes included); and, for each
key whose right rows changed at t, its left rows before t matched as of t and as of t - 1, only
those a change can reach (backward: times at or after the least changed right time; forward: at
or before the greatest; nearest: all). Unchanged pairs cancel when the output is consolidated.
A match as of t reads the key's right state plus the batch's right changes up to t, so every
transaction's output is what processing it alone gives, at every batch size.

State: both sides' rows, looked up by the `on` columns (right rows with a null time, which
never match, are not kept). Without a behavior both grow with their inputs, and a key's left
rows are read again whenever its right rows change (within reach).

Under a behavior (`Table.asof_join(..., behavior=)`) both inputs are a behavior's outputs
(`txstream.engine.operators.behavior`), each side's rows delayed and judged late by its own
clock. A left row is matched as its `FATE` says (pairs from `COUNTS` and `SHOWN` rows, the
state from `COUNTS` and `FORGETS`): the output is linear in the left side, so the rule above
holds with L the kept rows, and a forgotten left row's pair stays. The right side's behavior
forgets nothing: the join drops right rows itself, once no row can reach them. With cutoff c
and the two sides' clocks after the batch (`left_clock`, `right_clock`, their inputs' largest
times), let b = min(clocks) - c: every left row still in state or yet to come lies above b (at
or below it, its side's clock passed it by c: forgotten or late), and so does every right
change yet to come. A right row at or below b (forward), or below a row of its key at or below
b (backward, nearest: that row is nearer every left row above b), is no row's partner now or
later: dropped after the batch, changing no pair. The right rows are then few, read whole every
batch (not looked up). Pathway forgets a right row by the right's clock alone, which can
change a live left row's partner (to an earlier row or none); txstream never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, NumericType, StructField, StructType, TimestampType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, prefixed, union_all
from txstream.engine.nodes import AsofJoinNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import fated, rows_of, shown_and_kept
from txstream.engine.operators.clocks import CLOCK, advance, clock_state
from txstream.engine.operators.join import JoinLayout
from txstream.engine.state import ZSetState

# Within one batch's plans: the transaction a left row is matched as of, the right side's and a
# changed key's columns when joined, a right row's multiplicity then, and the candidates' rank.
_AS_OF, _RIGHT, _CHANGED = "__as_of", "__r_", "__c_"
_HELD, _RANK = "__held", "__rank"
# A key's latest right time at or below the time no row can reach past (see `_forget`).
_REACHED = "__reached"
# A changed key's least and greatest changed right time (in the time's units).
_LOW, _HIGH = "__low", "__high"


class AsofJoinOp(Operator):
    node: AsofJoinNode

    def _resolve(self) -> StructType:
        # Under a behavior both sides are its outputs (`txstream.engine.operators.behavior`):
        # their rows are the behavior's input's, and say their `FATE`.
        self.fated = fated(self.input_schemas[0])
        left, right = self.sides = [rows_of(s) for s in self.input_schemas]
        self.layout = JoinLayout(self, left, right, self.node.on)
        self._require(left, [self.node.left_time], "left time")
        self._require(right, [self.node.right_time], "right time")
        kinds = [left[self.node.left_time].dataType, right[self.node.right_time].dataType]
        timed = [isinstance(k, TimestampType) for k in kinds]
        if not all(isinstance(k, TimestampType | NumericType) for k in kinds) \
                or timed[0] != timed[1]:
            raise PipelineDefinitionError(
                f"{self.node.label}: times {self.node.left_time!r} "
                f"({kinds[0].simpleString()}) and {self.node.right_time!r} "
                f"({kinds[1].simpleString()}) must both be timestamps or both numbers")
        self.timed = timed[0]
        on = list(self.node.on) or None
        self.left_state = ZSetState(left.names, [DIFF], lookup=on, placement=self.placement)
        # Under a cutoff the right rows are read whole every batch (to drop those no row can
        # reach): few, so not looked up by key.
        self.right_state = ZSetState(right.names, [DIFF],
                                     lookup=on if self.node.cutoff is None else None,
                                     placement=self.placement)
        self.clocks = ([clock_state(self.placement), clock_state(self.placement)]
                       if self.node.cutoff is not None else [])
        return self.layout.schema

    def states(self) -> dict[str, ZSetState]:
        clocks = dict(zip(("left_clock", "right_clock"), self.clocks, strict=False))
        return {"left_state": self.left_state, "right_state": self.right_state, **clocks}

    def key(self, inputs: Sequence[Key]) -> Key:
        """The left's: each left row is in one pair (or padded) at a time."""
        return inputs[0]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [tuple(self.node.on) or None] * 2

    def _at(self, column: Column) -> Column:
        """A time in comparable units (microseconds for timestamps)."""
        return F.unix_micros(column) if self.timed else column

    def _held(self, state: ZSetState, probe: DataFrame, planned: int) -> DataFrame | None:
        """The state's rows of `probe`'s keys (all of them when it is not looked up: without
        `on` columns, or a right side under a cutoff), at BEFORE_BATCH."""
        on = list(self.node.on)
        held = (state.lookup(probe, on, planned) if state.lookup_on is not None
                else state.whole(planned))
        return None if held is None else held.withColumn(TIME, F.lit(BEFORE_BATCH).cast("long"))

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d_left, d_right = deltas
        if d_left is None and d_right is None:
            return None
        planned = batch.parallelism
        on = list(self.node.on)
        left_names = self.sides[0].names
        if self.clocks:
            bound = self._advance(d_left, d_right, batch)
        # The left rows as they are matched and as the state keeps them (a forgotten row leaves
        # the state, its pair stays); the right side's behavior forgets nothing (the join drops
        # what no row can reach, below), so its rows are matched as they are kept.
        if d_left is not None:
            d_left = batch.shared(batch.clustered(d_left, on) if on else d_left, on or None)
        kept_left = d_left
        if d_left is not None and self.fated:
            d_left, kept_left = (batch.shared(d, on or None)
                                 for d in shown_and_kept(d_left, batch))
        if d_right is not None:
            if self.fated:
                d_right = shown_and_kept(d_right, batch)[0]
            # A right row whose time is null matches nothing, now or ever: not kept.
            d_right = d_right.where(col(self.node.right_time).isNotNull())
            d_right = batch.shared(batch.clustered(d_right, on) if on else d_right, on or None)
        # The right rows of every key either side touched: the state's, and the batch's.
        touched = union_all([d.select(*[col(k) for k in on]) for d in (d_left, d_right)
                             if d is not None], planned)
        right = [d_right] if d_right is not None else []
        held = self._held(self.right_state, touched, planned)
        if held is not None and self.clocks:
            held = batch.shared(held)  # the whole right side, read by `_forget` too
        right += [held] if held is not None else []

        probes = []
        if d_left is not None:
            probes.append(d_left.select(*[col(n) for n in left_names],
                                        col(TIME).alias(_AS_OF), col(TIME), col(DIFF)))
            batch.append(self.left_state, kept_left)
        if d_right is not None:
            probes += self._reached(kept_left, d_right, planned)
        if self.clocks:
            self._forget(d_right, held, bound, batch)
        elif d_right is not None:
            batch.append(self.right_state, d_right)
        if not probes:
            return None  # right changes only, and no left rows they could reach
        if not right:  # no right rows yet: every probe is without a partner
            right = [self._empty(StructType([*self.sides[1].fields,
                                             StructField(TIME, LongType()),
                                             StructField(DIFF, LongType())]))]
        pairs = self._matched(union_all(probes, planned), union_all(right, planned), planned)
        # Consolidated always: a right change re-matches left rows most of which keep their
        # partner, and their two matches cancel here rather than in every reader.
        return batch.consolidated(pairs, self.columns, self.readers_cluster_by)

    def _reached(self, d_left: DataFrame | None, d_right: DataFrame, planned: int
                 ) -> list[DataFrame]:
        """For each key and transaction t with right changes, the key's left rows before t
        that a change can reach, to be matched as of t (+) and as of t - 1 (-), at t."""
        on, left_names = list(self.node.on), self.sides[0].names
        at = self._at(col(self.node.right_time))
        changed = build_side(prefixed(
            d_right.groupBy(*[col(k) for k in on], col(TIME))
            .agg(F.min(at).alias(_LOW), F.max(at).alias(_HIGH)), _CHANGED))
        lefts = [d_left.select(*[col(n) for n in left_names], col(TIME), col(DIFF))] \
            if d_left is not None else []
        held = self._held(self.left_state, d_right, planned)
        lefts += [held] if held is not None else []
        if not lefts:
            return []
        timeline = union_all(lefts, planned)
        left_at = self._at(timeline[f"`{self.node.left_time}`"])
        reach = {"backward": left_at >= changed[f"`{_CHANGED}{_LOW}`"],
                 "forward": left_at <= changed[f"`{_CHANGED}{_HIGH}`"],
                 "nearest": left_at.isNotNull()}[self.node.direction]
        cond = reduce(lambda a, b: a & b,
                      [timeline[f"`{k}`"] == changed[f"`{_CHANGED}{k}`"] for k in on],
                      (timeline[f"`{TIME}`"] < changed[f"`{_CHANGED}{TIME}`"]) & reach)
        at_t = col(f"{_CHANGED}{TIME}")
        before = (join(timeline, changed, cond, "inner", planned)
                  .groupBy(*[col(n) for n in left_names], at_t.alias(TIME))
                  .agg(F.sum(col(DIFF)).alias(DIFF)).where(col(DIFF) > 0))
        rows = [col(n) for n in left_names]
        return [before.select(*rows, col(TIME).alias(_AS_OF), col(TIME), col(DIFF)),
                before.select(*rows, (col(TIME) - 1).alias(_AS_OF), col(TIME),
                              (-col(DIFF)).alias(DIFF))]

    def _matched(self, probes: DataFrame, right: DataFrame, planned: int) -> DataFrame:
        """Each probe (a left row, the transaction `_AS_OF` it is matched as of, and its own
        time and diff) with its partner among the `right` rows present then (the right's
        columns null without one; dropped then by an inner join)."""
        lay = self.layout
        left_names = self.sides[0].names
        probes = (probes.groupBy(*[col(n) for n in left_names], col(_AS_OF), col(TIME))
                  .agg(F.sum(col(DIFF)).alias(DIFF)).where(col(DIFF) != 0))
        r = build_side(prefixed(right, _RIGHT))
        left_at = self._at(probes[f"`{self.node.left_time}`"])
        right_at = self._at(r[f"`{_RIGHT}{self.node.right_time}`"])
        reachable = {"backward": right_at <= left_at, "forward": right_at >= left_at,
                     "nearest": left_at.isNotNull()}[self.node.direction]
        cond = reduce(lambda a, b: a & b,
                      [probes[f"`{k}`"] == r[f"`{_RIGHT}{k}`"] for k in lay.on],
                      (r[f"`{_RIGHT}{TIME}`"] <= probes[f"`{_AS_OF}`"]) & reachable)
        probe = [col(n) for n in left_names] + [col(_AS_OF), col(TIME), col(DIFF)]
        partner = [col(f"{_RIGHT}{c}") for c in lay.right_rest]
        candidates = (join(probes, r, cond, "left", planned)
                      .groupBy(*probe, *partner).agg(F.sum(col(f"{_RIGHT}{DIFF}")).alias(_HELD)))
        present = F.coalesce(col(_HELD) > 0, F.lit(False))
        right_at = self._at(col(f"{_RIGHT}{self.node.right_time}"))
        nearest = {"backward": [right_at.desc()], "forward": [right_at.asc()],
                   "nearest": [F.abs(right_at - self._at(col(self.node.left_time))).asc(),
                               right_at.desc()]}[self.node.direction]
        ties = [col(f"{_RIGHT}{c}").asc_nulls_first() for c in lay.right_rest
                if c != self.node.right_time]
        ranked = Window.partitionBy(*probe[:-1]).orderBy(present.desc(), *nearest, *ties)
        best = candidates.select("*", F.row_number().over(ranked).alias(_RANK)) \
            .where(col(_RANK) == 1)
        if self.node.how == "inner":
            best = best.where(present)
        return best.select(
            *[col(c) for c in lay.on + lay.left_rest],
            *[F.when(present, col(f"{_RIGHT}{c}")).alias(c) for c in lay.right_rest],
            col(TIME), col(DIFF))

    def _advance(self, d_left: Delta, d_right: Delta, batch: BatchPlan) -> DataFrame:
        """Stage each side's clock after the batch (its rows' largest time so far, every row
        counted) and return the time at or below which no row can reach a right row any more
        (one row, `CLOCK`): the smaller clock minus the cutoff. Each side's clock trails its
        behavior's (a delayed row counts from its release), which only delays forgetting."""
        after = []
        for side, (state, d) in enumerate(zip(self.clocks, (d_left, d_right), strict=True)):
            before = state.whole(batch.parallelism)
            time = (self.node.left_time, self.node.right_time)[side]
            peaks = ([before.select(col(CLOCK))] if before is not None else []) + (
                [d.select(self._at(col(time)).alias(CLOCK))] if d is not None else [])
            if not peaks:  # no row on this side yet: no clock, nothing to forget
                after.append(self._empty(StructType([StructField(f"{CLOCK}{side}", LongType())])))
                continue
            clock = batch.shared(
                union_all(peaks, batch.parallelism).agg(F.max(col(CLOCK)).alias(CLOCK)))
            if d is not None:
                advance(state, before, clock, batch)
            after.append(clock.select(col(CLOCK).alias(f"{CLOCK}{side}")))
        # Null while a side's clock is (its rows so far without a time): no row of it is late
        # then, so nothing can be dropped (`least` would skip the null).
        clocks = [col(f"{CLOCK}{side}") for side in (0, 1)]
        return after[0].crossJoin(after[1]).select(
            F.when(clocks[0].isNotNull() & clocks[1].isNotNull(),
                   F.least(*clocks) - F.lit(self.node.cutoff)).alias(CLOCK))

    def _forget(self, d_right: Delta, held: DataFrame | None, bound: DataFrame,
                batch: BatchPlan) -> None:
        """Stage the batch's right changes and drop the right rows (`held`: the state's, whole)
        no row can reach any more:
        those at or below `bound` (forward), or below a row of their key at or below it
        (backward, nearest; the nearest row is never further than that one). A left row at or
        below the bound is late or forgotten (its side's clock passed it by the cutoff), and so
        is any change of a right row there: what is dropped changes no pair, now or later."""
        planned = batch.parallelism
        on, names = list(self.node.on), self.sides[1].names
        changes = [d_right.select(*[col(n) for n in names], col(DIFF))] \
            if d_right is not None else []
        parts = changes + ([held.select(*[col(n) for n in names], col(DIFF))]
                           if held is not None else [])
        if not parts:
            return
        present = (union_all(parts, planned).groupBy(*[col(n) for n in names])
                   .agg(F.sum(col(DIFF)).alias(DIFF)).where(col(DIFF) != 0)
                   .crossJoin(F.broadcast(bound)))
        at = self._at(col(self.node.right_time))
        if self.node.direction == "forward":
            gone = present.where(at <= col(CLOCK))
        else:
            latest = Window.partitionBy(*[col(k) for k in on]) if on else Window.partitionBy()
            reached = F.max(F.when(at <= col(CLOCK), at)).over(latest)
            gone = present.select("*", reached.alias(_REACHED)).where(at < col(_REACHED))
        dropped = gone.select(*[col(n) for n in names], (-col(DIFF)).alias(DIFF))
        batch.append(self.right_state, union_all([dropped, *changes], planned))
