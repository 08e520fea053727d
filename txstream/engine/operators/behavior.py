"""Temporal behavior: when a windowed table's rows reach the reduce after it, and when they leave
(Pathway's `common_behavior(delay, cutoff, keep_results)`; `exactly_once_behavior(shift)` is
`delay = duration + shift, cutoff = shift`); the same for each side of a join by time.

    windowed rows --> [ clock | late? | buffer until released | kept until closed ] --> reduce
    a join's side --> [ the same, a row its own window: start = end = its time ] --> join

The rule (DESIGN section 10), per row of the input (a row in one of its windows, with its
transaction N and diff; the window's `start` and `end` are the node's `bounds` columns, both a
join side's time, so a row is released at `time + delay` and closed at `time + cutoff`):

* clock: `C(N)`, the largest event time of the input's rows of transactions up to N (one clock
  for the table, deletions included; a transaction's changes consolidated first);
* late: the row is ignored when `end + cutoff <= C(N - 1)`, the clock before its transaction;
* released (emitted) in the first transaction M >= N with `C(M) >= start + delay` (N's own
  rows count), at once without a delay;
* closed in the first transaction K with `C(K) >= end + cutoff`: with `keep_results=False` the
  window's released rows are retracted at K (a window closed at or before its release is never
  shown); with `keep_results=True` they leave at `max(M, K)`, from the reduce's state and not
  from its output: the result stays, the state goes.

Every row of the output says its `FATE`: `COUNTS` (the reduce's state and output), `FORGETS`
(its state only), `SHOWN` (its output only: a row released and forgotten in one transaction,
as every row of `exactly_once_behavior`, which would otherwise reach the reduce twice) or `LATE`
(neither: the late rows' table, `txstream.engine.operators.late`, which takes `LATE_CLOCK`, the
clock before the row's transaction, null on the other rows). A join reads them as the reduce
does (`shown_and_kept`): its pairs are made of `COUNTS` and `SHOWN` rows, its state keeps
`COUNTS` and `FORGETS`, so a forgotten row's pairs stay and it pairs with no later row.

A node that does not forget (`forgets=False`, an as-of join's right side) judges rows late and
delays them, but never closes: every released row `COUNTS`, none leaves. A row whose bounds are
null (a join side's row without a time) is never late, released at once and never closed.

Delta rule: the clock after each transaction of the batch is a running maximum over the
batch's transactions, started from the clock before it (state); so are, per window, its
release time R and its close time K (the first of the batch's transactions, or `BEFORE_BATCH`,
whose clock reaches the window's thresholds). A row of the batch at N is late when `K < N`,
released at `max(N, R)`; a buffered row at R; a row kept since its release is retracted at K.
Every such time is a transaction of the batch, so the output of each transaction is what
processing it alone gives, at every batch size.

State: `clock` (the one value of the clock), `buffer` (rows not yet released, with a delay),
`released` (rows released and not yet closed, with a cutoff, when the node forgets). All three
are bounded by the windows still open (a closed window's rows leave both) and the rows without
a time (never a source's: such a record is a dead letter; of a computed time, only on a side a
join shows padded, the left of a left as-of join or a padded side of an interval join: other
joins leave them out before the behavior), which stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, NumericType, StructField, StructType, TimestampType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, prefixed, union_all
from txstream.engine.nodes import BehaviorNode
from txstream.engine.operators.base import Delta, Operator
from txstream.engine.operators.clocks import BEFORE, CLOCK, advance, clock_state, running
from txstream.engine.state import ZSetState
from txstream.engine.temporal import event_micros

# Output columns (see the module doc): what the reduce does with a row, and a late row's clock.
FATE, LATE_CLOCK = "__fate", "__late_clock"
COUNTS, FORGETS, SHOWN, LATE = 0, 1, 2, 3
# Within one batch's plans: where a row comes from (the batch, the buffer, the released rows),
# a window's release and close times, the window's bounds in the thresholds' frame, and the
# clocks' columns in the frame late rows are joined with.
_FROM, _RELEASE, _CLOSE, _WINDOW = "__from", "__release", "__close", "__window_"
_CLOCKS = "__clocks_"
_BATCH, _BUFFERED, _RELEASED = 0, 1, 2


class BehaviorOp(Operator):
    node: BehaviorNode
    sees_transactions = True

    def _resolve(self) -> StructType:
        # The input may be a delaying behavior's output (a join side under a delay and a cutoff,
        # as Pathway chains them), whose rows all count: read as the rows they are.
        src = self.rows = rows_of(self.input_schemas[0])
        start, end = self.node.bounds
        self._require(src, [self.node.time, start, end], "event-time")
        time = src[self.node.time].dataType
        if not isinstance(time, TimestampType if self.node.timed else NumericType):
            raise PipelineDefinitionError(
                f"{self.node.label}: time {self.node.time!r} is {time.simpleString()}, but the "
                "behavior's lengths are " + ("timedeltas (for timestamps)" if self.node.timed
                                             else "numbers (for numeric times)"))
        names = src.names
        behavior = self.node.behavior
        self.clock = clock_state(self.placement)
        self.buffer = (ZSetState(names, [DIFF], placement=self.placement)
                       if behavior.delay is not None else None)
        self.released = (ZSetState(names, [DIFF], placement=self.placement)
                         if self.closes else None)
        return StructType([*src.fields, StructField(FATE, IntegerType(), False),
                           StructField(LATE_CLOCK, time, True)])

    @property
    def closes(self) -> bool:
        """Whether released rows leave at close (a cutoff, and rows that are forgotten)."""
        return self.node.behavior.cutoff is not None and self.node.forgets

    def engine_columns(self) -> frozenset[str]:
        return frozenset({FATE, LATE_CLOCK})

    def states(self) -> dict[str, ZSetState]:
        found = {"clock": self.clock, "buffer": self.buffer, "released": self.released}
        return {name: state for name, state in found.items() if state is not None}

    def _at(self, column: str) -> Column:
        """A time column or window bound in the behavior's units (microseconds or numbers)."""
        return F.expr(event_micros(f"`{column}`", self.node.timed))

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None  # the clock moves with rows only: nothing is released or closed
        planned = batch.parallelism
        names = self.rows.names
        rows = [col(n) for n in names]
        # Consolidated (a row inserted and deleted in one transaction moves no clock), and read
        # three times below: computed once.
        d = batch.shared(d)

        # The clock after each transaction of the batch (BEFORE_BATCH: the clock before it).
        before = self.clock.whole(planned)
        clocks = running(d.groupBy(col(TIME)).agg(F.max(self._at(self.node.time)).alias(CLOCK)),
                         before, batch)

        # Every row the batch may move: its own (at their transactions), the buffered and the
        # kept ones (before the batch).
        parts = [d.select(*rows, col(TIME), col(DIFF), F.lit(_BATCH).alias(_FROM))]
        for state, origin in ((self.buffer, _BUFFERED), (self.released, _RELEASED)):
            held = state.whole(planned) if state is not None else None
            if held is not None:
                parts.append(held.select(*rows, F.lit(BEFORE_BATCH).cast("long").alias(TIME),
                                         col(DIFF), F.lit(origin).alias(_FROM)))
        entries = union_all(parts, planned)

        windows = build_side(prefixed(self._thresholds(entries, clocks, planned), _WINDOW))
        # Null-safe: a row whose bounds are null (a join side's row without a time) is never
        # late, released at once and never closed.
        on = reduce(lambda a, b: a & b, [entries[f"`{b}`"].eqNullSafe(windows[f"`{_WINDOW}{b}`"])
                                         for b in self._bounds])
        marked = batch.shared(
            join(entries, windows, on, "inner", planned)
            .select(*rows, col(TIME), col(DIFF), col(_FROM),
                    col(f"{_WINDOW}{_RELEASE}").alias(_RELEASE),
                    col(f"{_WINDOW}{_CLOSE}").alias(_CLOSE)))
        late = self._late()
        on_time = marked.where(~late)

        released, close = self._released_at(), col(_CLOSE)
        keep = self.node.behavior.keep_results or not self.node.forgets
        # Whether the row's window closed at or before its release (never without a cutoff):
        # with keep_results=False it is never shown; with results kept it is forgotten as it
        # is shown.
        closed_first = F.coalesce(close <= released, F.lit(False))
        shown = released.isNotNull() & (released != BEFORE_BATCH) & (
            F.lit(True) if keep else ~closed_first)
        no_clock = F.lit(None).cast(self.schema[LATE_CLOCK].dataType).alias(LATE_CLOCK)
        fate = F.when(closed_first, F.lit(SHOWN)).otherwise(F.lit(COUNTS)) \
            if keep and self.closes else F.lit(COUNTS)
        changes = [on_time.where(shown).select(*rows, fate.alias(FATE), no_clock,
                                               released.alias(TIME), col(DIFF))]
        if self.closes:
            # The rest of a closed window's released rows: forgotten (results kept) or retracted.
            retracted = released.isNotNull() & close.isNotNull() & (close > released)
            changes.append(on_time.where(retracted).select(
                *rows, F.lit(FORGETS if keep else COUNTS).alias(FATE), no_clock,
                close.alias(TIME), (-col(DIFF)).alias(DIFF)))
        if self.node.behavior.cutoff is not None:
            changes.append(self._late_rows(marked.where(late), clocks, planned))

        # What the states hold after the batch: buffered rows not yet released (with
        # keep_results=False, not those of a window closed first), released rows not closed.
        waiting = released.isNull() & (F.lit(True) if keep else close.isNull())
        if self.buffer is not None:
            batch.append(self.buffer, self._moved(on_time, waiting, _BUFFERED, (_BATCH,)))
        if self.released is not None:
            batch.append(self.released, self._moved(
                on_time, released.isNotNull() & close.isNull(), _RELEASED, (_BATCH, _BUFFERED)))
        advance(self.clock, before, clocks, batch)
        return self._output(union_all(changes, planned), batch)

    def _thresholds(self, entries: DataFrame, clocks: DataFrame, planned: int) -> DataFrame:
        """Per window of `entries`, its release time (`_RELEASE`, a delay given) and its close
        time (`_CLOSE`, a cutoff given): the first transaction of the batch, or BEFORE_BATCH,
        whose clock reaches `start + delay` and `end + cutoff`; null when none does."""
        behavior = self.node.behavior
        reached = []
        for threshold, name, bound in ((behavior.delay, _RELEASE, self.node.bounds[0]),
                                       (behavior.cutoff, _CLOSE, self.node.bounds[1])):
            first = (F.min(F.when(col(CLOCK) >= self._at(bound) + F.lit(threshold), col(TIME)))
                     if threshold is not None else F.lit(None).cast("long"))
            reached.append(first.alias(name))
        bounds = [col(b) for b in self._bounds]
        pairs = entries.select(*bounds).distinct().crossJoin(clocks)
        # A product's partitioning is unknown to Spark: at P = 1 it is said to be one partition,
        # or the aggregate would exchange it into the session's shuffle partitions and back.
        return (pairs.coalesce(1) if planned == 1 else pairs).groupBy(*bounds).agg(*reached)

    @property
    def _bounds(self) -> list[str]:
        """The bounds' columns, each once (a join side's time is both)."""
        return list(dict.fromkeys(self.node.bounds))

    def _late_rows(self, late: DataFrame, clocks: DataFrame, planned: int) -> DataFrame:
        """The late rows, at their transactions, with the clock before it (in the time
        column's type)."""
        before = build_side(prefixed(clocks.select(col(TIME), col(BEFORE)), _CLOCKS))
        clock = col(f"{_CLOCKS}{BEFORE}")
        if self.node.timed:
            clock = F.timestamp_micros(clock)
        return join(late, before, late[f"`{TIME}`"] == before[f"`{_CLOCKS}{TIME}`"], "inner",
                    planned).select(*[col(n) for n in self.rows.names],
                                    F.lit(LATE).alias(FATE),
                                    clock.cast(self.schema[LATE_CLOCK].dataType).alias(LATE_CLOCK),
                                    col(TIME), col(DIFF))

    def _late(self) -> Column:
        """Whether a row of the batch is late: its window closed before its transaction (the
        close time of a held row is never before BEFORE_BATCH, its time)."""
        if self.node.behavior.cutoff is None:
            return F.lit(False)
        return F.coalesce(col(_CLOSE) < col(TIME), F.lit(False))

    def _released_at(self) -> Column:
        """When a row is released: BEFORE_BATCH for a row released before, its transaction
        without a delay, else the later of its transaction and its window's release (null:
        not in this batch)."""
        start = col(self.node.bounds[0])
        release = (col(TIME) if self.node.behavior.delay is None
                   else F.when(start.isNull(), col(TIME))
                   .when(col(_RELEASE).isNotNull(), F.greatest(col(TIME), col(_RELEASE))))
        return F.when(col(_FROM) == _RELEASED, F.lit(BEFORE_BATCH).cast("long")) \
            .otherwise(release)

    def _moved(self, marked: DataFrame, stays: Column, origin: int, entering: tuple[int, ...]
               ) -> DataFrame:
        """A state's changes: the rows from `entering` (the batch, the buffer) that `stays` says
        it holds now, minus its own rows (`origin`) that `stays` lets go."""
        diff = (F.when(col(_FROM).isin(*entering) & stays, col(DIFF))
                .when((col(_FROM) == origin) & ~stays, -col(DIFF))
                .otherwise(F.lit(0).cast("long")))
        return marked.select(*[col(n) for n in self.rows.names],
                             diff.alias(DIFF)).where(col(DIFF) != 0)


def fated(schema: StructType) -> bool:
    """Whether `schema` is a behavior's output (its rows say their `FATE`)."""
    return FATE in schema.names


def rows_of(schema: StructType) -> StructType:
    """A behavior's output schema without the behavior's columns: its input's."""
    return StructType([f for f in schema.fields if f.name not in (FATE, LATE_CLOCK)])


def shown_and_kept(changes: DataFrame, batch: BatchPlan) -> tuple[DataFrame, DataFrame]:
    """Of a behavior's output `changes`, without the behavior's columns, the rows a join after
    it pairs into its output (`COUNTS`, `SHOWN`) and those its state keeps (`COUNTS`,
    `FORGETS`); a late row is neither. Clustered as `changes` are. The reduce reads its
    input's fates by the same rule."""
    rows = rows_of(changes.schema).names

    def having(*fates: int) -> DataFrame:
        return batch.keeps(changes.where(col(FATE).isin(*fates)).select(*rows), changes)
    return having(COUNTS, SHOWN), having(COUNTS, FORGETS)
