"""Inner equi-join, and the padding that builds outer joins from it.

Delta rule: d(A join B) = dA join (B + dB) + A join dB, where A and B are the states before the
batch; a pair's time is the later of its two times and its diff the product of their diffs.

After a temporal behavior (an interval join's sides) a side's rows say their `FATE`: its pairs
are made of the rows that count and those shown (dA'), its state keeps those that count and
those forgotten (dA''), so a forgotten row's pairs stay and it pairs with no later row. At a
transaction t the state is A + dA'' before t, so dA join dB becomes dA'(t) join dB''(< t) +
dA''(< t) join dB'(t) + dA'(t) join dB'(t): a change pairs with the other side's earlier
changes as they were kept (without a behavior, dA' = dA'' = dA and the three are dA join dB).
State: both sides' Z-sets, looked up by the join key. The hash table is built from the deltas;
state's small runs are streamed past it, its large runs probed through their indexes (see
`txstream.engine.indexed_runs`).

Columns no reader reads (`Operator.needed`) are null in the pairs and in the states: with p
the projection that nulls them, p(dA join B) = p(dA) join p(B), and p(dA) is consolidated before
it pairs and before it joins the state, so a change of those columns alone (a customer's
region, under a group-by of customers' orders by customer) cancels there instead of pairing,
twice, with every row of its key on the other side. What the states hold thus depends on the
readers: the null columns are part of their saved layout (`state_layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, null, prefixed, union_all
from txstream.engine.nodes import JoinNode, PadNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import FATE, fated, rows_of, shown_and_kept
from txstream.engine.state import ZSetState

# Prefix of the right side's columns while the two sides meet.
_RIGHT = "__r_"


class JoinLayout:
    """Column layout of an equi-join: keys, left's other columns, right's other columns."""

    def __init__(self, op: Operator, left: StructType, right: StructType, on: Sequence[str]
                 ) -> None:
        op._require(left, on, "left join key")
        op._require(right, on, "right join key")
        for k in on:
            lt, rt = left[k].dataType.simpleString(), right[k].dataType.simpleString()
            if lt != rt:
                raise PipelineDefinitionError(
                    f"{op.node.label}: key {k!r} is {lt} on the left but {rt} on the right; "
                    "cast one side with select"
                )
        self.on = list(on)
        self.left_rest = [c for c in left.names if c not in on]
        self.right_rest = [c for c in right.names if c not in on]
        clash = sorted(set(self.left_rest) & set(self.right_rest))
        if clash:
            raise PipelineDefinitionError(
                f"{op.node.label}: column(s) {', '.join(clash)} exist on both sides; "
                "rename them with select before joining"
            )
        self.schema = StructType(
            [left[k] for k in on] + [left[c] for c in self.left_rest]
            + [right[c] for c in self.right_rest]
        )


class JoinOp(Operator):
    node: JoinNode
    reads_unconsolidated = True
    multiplies_rows = True

    def _resolve(self) -> StructType:
        # A side after a temporal behavior (an interval join's) pairs and is kept as its rows'
        # `FATE` says; its rows are the behavior's input's.
        self.fated = [fated(s) for s in self.input_schemas]
        self.sides = [rows_of(s) for s in self.input_schemas]
        self.layout = JoinLayout(self, self.sides[0], self.sides[1], self.node.on)
        self.left_state = ZSetState(self.sides[0].names, [DIFF], lookup=self.node.on,
                                    placement=self.placement)
        self.right_state = ZSetState(self.sides[1].names, [DIFF], lookup=self.node.on,
                                     placement=self.placement)
        return self.layout.schema

    def states(self) -> dict[str, ZSetState]:
        return {"left_state": self.left_state, "right_state": self.right_state}

    def key(self, inputs: Sequence[Key]) -> Key:
        """A side's key when the other side's key is among the join columns (each of its rows
        meets at most one row of the other side); otherwise both keys together."""
        left, right = inputs
        if left is None or right is None:
            return None
        on = set(self.node.on)
        if set(right) <= on:
            return left
        if set(left) <= on:
            return right
        return tuple(dict.fromkeys(left + right))

    def _pairs(self, left: DataFrame, right: DataFrame, batch: BatchPlan,
               times: Callable[[Column, Column], Column] | None = None) -> DataFrame:
        """The pairs of `left`'s and `right`'s rows of equal keys (and, given `times`, whose
        times, left's and right's, it holds for)."""
        lay = self.layout
        r = prefixed(right, _RIGHT)
        # SQL join semantics: a null key matches nothing.
        cond = [left[f"`{k}`"] == r[f"`{_RIGHT}{k}`"] for k in lay.on]
        if times is not None:
            cond.append(times(left[TIME], r[f"{_RIGHT}{TIME}"]))
        # Both sides' rows, deltas and states, hold nulls in the columns no reader reads.
        return join(left, r, reduce(lambda a, b: a & b, cond), "inner",
                    batch.parallelism).select(
            *[left[f"`{c}`"] for c in lay.on + lay.left_rest],
            *[r[f"`{_RIGHT}{c}`"].alias(c) for c in lay.right_rest],
            F.greatest(left[TIME], r[f"{_RIGHT}{TIME}"]).alias(TIME),
            (left[DIFF] * r[f"{_RIGHT}{DIFF}"]).alias(DIFF),
        )

    @staticmethod
    def _before(state: ZSetState, probe: DataFrame, batch: BatchPlan
                ) -> tuple[list[DataFrame], list[DataFrame]]:
        """The state's rows that may pair with `probe`'s: its streamed runs whole, and apart
        its indexed runs' rows with `probe`'s keys (at P > 1 a union of the two would declare
        no partitioning, and the join would exchange the streamed runs whole)."""
        def before(frame: DataFrame) -> DataFrame:
            return frame.withColumn(TIME, F.lit(BEFORE_BATCH).cast("long"))
        whole = state.frame(batch.parallelism)
        return ([before(whole)] if whole is not None else [],
                [before(found) for found in state.matches(probe, batch.parallelism)])

    def _nulled(self, side: int) -> list[str]:
        """The side's columns no reader reads (never a join key)."""
        return [c for c in self.sides[side].names
                if c not in self.needed and c not in self.node.on]

    def state_layout(self) -> str:
        nulled = self._nulled(0) + self._nulled(1)
        return f"null: {', '.join(nulled)}" if nulled else ""

    def _projected(self, d: DataFrame, side: int, batch: BatchPlan) -> DataFrame:
        """The side's delta `d` as it pairs and joins the state: with the columns no reader
        reads null and consolidated (see the module doc), computed once for its several
        readers; `d` itself when readers read every column."""
        nulled = self._nulled(side)
        if not nulled:
            return d
        schema = self.sides[side]
        kept = [c for c in schema.names if c not in nulled]
        # Clustered by the join key still, which is kept: consolidated where it is.
        consolidated = batch.consolidated(
            batch.keeps(d.select(*[col(c) for c in kept], col(TIME), col(DIFF)), d), kept,
            (tuple(self.node.on),))
        return batch.shared(consolidated.select(
            *[null(schema[c]) if c in nulled else col(c) for c in schema.names],
            col(TIME), col(DIFF)), clustered_by=self.node.on)

    def _split(self, d: Delta, side: int, batch: BatchPlan
               ) -> tuple[DataFrame | None, DataFrame | None]:
        """The side's delta as it pairs and as its state keeps it: the same frame but after a
        temporal behavior, where a forgotten row leaves the state alone, a row shown and
        forgotten at once pairs alone, and a late row does neither (the reduce's rule,
        `txstream.engine.operators.reduce`)."""
        if d is None:
            return None, None
        d = batch.clustered(d, self.node.on)
        if not self.fated[side]:
            d = self._projected(d, side, batch)
            return d, d
        shown, kept = shown_and_kept(d, batch)
        return self._projected(shown, side, batch), self._projected(kept, side, batch)

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        # At P > 1 both deltas meet the states where they are partitioned, by the join key.
        (d_left, kept_left), (d_right, kept_right) = [
            self._split(d, i, batch) for i, d in enumerate(deltas)]
        if d_left is None and d_right is None:
            return None
        terms: list[DataFrame] = []
        if d_left is not None:
            right_all, right_found = self._before(self.right_state, d_left, batch)
            if d_right is not None and kept_right is d_right and kept_left is d_left:
                right_all.append(d_right)  # the two deltas' pairs, with the state's
            elif d_right is not None:
                terms += self._within(d_left, kept_left, d_right, kept_right, batch)
            terms += [self._pairs(build_side(d_left), union_all(side, batch.parallelism), batch)
                      for side in (right_all, right_found) if side]
            batch.append(self.left_state, kept_left)
        if d_right is not None:
            left_before, left_found = self._before(self.left_state, d_right, batch)
            terms += [self._pairs(union_all(side, batch.parallelism), build_side(d_right), batch)
                      for side in (left_before, left_found) if side]
            batch.append(self.right_state, kept_right)
        if not terms:
            return None
        # Each pair is made where both sides' rows of its key are: the pairs are clustered by
        # the join key too, and consolidated there (where a reader needs them so) rather than
        # exchanged by a reader's key (a group-by on more keys than the join's exchanges its
        # accumulators instead).
        pairs = batch.keeps(union_all(terms, batch.parallelism),
                            *[d for d in (d_left, d_right) if d is not None])
        return self._output(pairs, batch)

    def _within(self, shown_left: DataFrame, kept_left: DataFrame, shown_right: DataFrame,
                kept_right: DataFrame, batch: BatchPlan) -> list[DataFrame]:
        """The pairs the two deltas make when a side's rows pair otherwise than they are kept
        (after a temporal behavior): a change pairs with the other side's changes of its own
        transaction as it pairs, with those of earlier transactions as they were kept, since
        at its transaction those are the other side's state."""
        return [self._pairs(build_side(shown_left), kept_right, batch, lambda lt, rt: rt < lt),
                self._pairs(kept_left, build_side(shown_right), batch, lambda lt, rt: lt < rt),
                self._pairs(build_side(shown_left), shown_right, batch,
                            lambda lt, rt: lt == rt)]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [tuple(self.node.on)] * 2

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        """The join key and what readers read of each side."""
        on = frozenset(self.node.on)
        return [on | (needed & set(s.names)) | ({FATE} if fate else set())
                for s, fate in zip(self.input_schemas, self.fated, strict=True)]


class PadOp(Operator):
    """Rows of one join side with the other side's columns null (the outer part of a join)."""

    node: PadNode
    passes_through = True

    def _resolve(self) -> StructType:
        side, other = self.input_schemas
        left, right = (side, other) if self.node.side == "left" else (other, side)
        self.layout = JoinLayout(self, left, right, self.node.on)
        return self.layout.schema

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        own = wanted is not None and set(wanted) <= set(self.input_schemas[0].names)
        return [wanted if own else None, None]

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        """What readers read of the side's own columns; of the other side, only its schema."""
        return [needed & set(self.input_schemas[0].names), frozenset()]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        own = set(self.input_schemas[0].names)
        # The side's own columns pass as they are, so its clustering stays true.
        return batch.keeps(d.select(
            *[col(f.name) if f.name in own else null(f) for f in self.schema.fields],
            col(TIME), col(DIFF),
        ), d)
