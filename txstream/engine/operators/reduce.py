"""Group-by/reduce: one row per group, the key columns then one column per reducer.

Delta rule: for each group and transaction the batch touches, retract the group's row as it
was before the transaction and insert its row after it, unless the two are equal.

State (each a Z-set, see `txstream.engine.state`):
- `acc_state`: per group, the row count and the reducers' linear accumulators (sums, non-null
  counts), so a group's new accumulators are its old ones plus the batch's running sums;
- `value_states`: per column that `min`, `max` or `count_distinct` read, each group's multiset
  of non-null values.
A group's row is a function of these, so the row to retract before the batch's first
transaction is computed from the state as it was before the batch (time `BEFORE_BATCH`), the
same way every later row is: no trace of the emitted rows is kept.

After a temporal behavior (of windows or of sessions), each input row's `FATE` says what it
does: `COUNTS` as any row; `FORGETS` (a closed window's rows retracted, results kept) the state
alone, so the window's row stays in the output and its group leaves the state; `SHOWN` (rows
released and forgotten at once) the output alone; `LATE` nothing
(txstream.engine.operators.behavior and .session).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, ROW_COUNT, TIME
from txstream.engine.consolidation import consolidate
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import (
    build_side,
    col,
    join,
    null_safe_on,
    prefixed,
)
from txstream.engine.nodes import ReduceNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import FATE, LATE, shown_and_kept
from txstream.engine.reducers import Reducer, ReducerError, ValueStats
from txstream.engine.results import INSERT, OLD, RETRACT, Pairs
from txstream.engine.state import ZSetState
from txstream.schemas.tables import ColumnType

# Open end of a value's presence interval: later than every transaction.
_FOREVER = 2**62

# The helper columns of a group-by, named once (with INTERNAL_PREFIX, so no user column is one).
# In the saved state (a new name would make earlier checkpoints unreadable):
ACCUMULATOR = "__acc"  # + a number: one of the reducers' linear accumulators
VALUE = "__v"  # a value of a column that min, max or count_distinct read
# Within one batch's plans:
BEFORE = "__before_"  # + an accumulator: its sum over a timeline's rows of earlier times
PREVIOUS = "__previous"  # the row of a group before each row of its timeline (a struct)
CHANGES = "__changes"  # the retraction and the insertion between two rows of a timeline
_HIT = "__hit"  # whether the batch touches a value of a group's multiset
_LAST = "__last"  # whether a row of a group's timeline is the last of its time
# A touched value present from a time until (excluded) the next change of its count.
FROM, UNTIL, COUNT = "__from", "__until", "__count"
# A group's min, max and distinct count of one column's values: of the values the batch
# touches, at each time; of the values it does not touch (constant over the batch); and of all
# of them, for value column number i (`value_stats(i)`).
TOUCHED_STATS = ("__touched_min", "__touched_max", "__touched_count")
STEADY_STATS = ("__steady_min", "__steady_max", "__steady_count")
# Prefixes of the columns of the frames that meet in the value columns' joins: the touched
# values' intervals, their stats at each time, and the untouched values' stats.
INTERVALS, PRESENT, STEADY = "__intervals_", "__present_", "__steady_"


def value_stats(i: int) -> tuple[str, str, str]:
    """The columns of value column number i's min, max and distinct count."""
    return f"__min{i}", f"__max{i}", f"__distinct{i}"


def _stats(value: Column, names: tuple[str, str, str]) -> list[Column]:
    """Min, max and count of the rows' `value`, named `names`."""
    return [F.min(value).alias(names[0]), F.max(value).alias(names[1]),
            F.count(F.lit(1)).alias(names[2])]


class ReduceOp(Operator):
    node: ReduceNode
    reads_unconsolidated = True

    def _resolve(self) -> StructType:
        src = self.input_schemas[0]
        keys = list(self.node.keys)
        self._require(src, keys, "group-by")
        # After a temporal behavior, whose rows say what they do to the reduce (`FATE`).
        self.temporal = FATE in src.names
        self.keys = keys
        fields = [src[k] for k in keys]
        self.column_types: dict[str, ColumnType | None] = {}
        accumulators: dict[str, Column] = {}
        value_columns: list[str] = []
        for name, red in self.node.reducers:
            ctype = self._column_type(name, red, src)
            self.column_types[name] = ctype
            spark_type = src[red.column].dataType if red.column is not None else None
            fields.append(StructField(name, red.result_type(ctype, spark_type), True))
            accumulators.update(red.accumulators(ctype))
            if red.needs_values and red.column not in value_columns:
                value_columns.append(red.column)  # type: ignore[arg-type]
        # Accumulator ids name columns of the user's; state columns get internal names.
        self.acc_names = {acc: f"{ACCUMULATOR}{i}" for i, acc in enumerate(accumulators)}
        self.acc_exprs = {self.acc_names[acc]: e for acc, e in accumulators.items()}
        self.acc_cols = [ROW_COUNT, *self.acc_exprs]
        self.acc_state = ZSetState(keys, self.acc_cols, empty_when=f"`{ROW_COUNT}` = 0",
                                   lookup=keys, placement=self.placement)
        self.value_index = {c: i for i, c in enumerate(value_columns)}
        self.value_states = {c: ZSetState([*keys, VALUE], [DIFF], lookup=keys,
                                          placement=self.placement)
                             for c in value_columns}
        return StructType(fields)

    def _column_type(self, name: str, red: Reducer, src: StructType) -> ColumnType | None:
        if red.column is not None:
            self._require(src, [red.column], f"reducer {name}={red}")
        ctype = (ColumnType.from_spark(src[red.column].dataType.simpleString())
                 if red.column is not None else None)
        try:
            red.check(ctype)
        except ReducerError as exc:
            raise PipelineDefinitionError(f"{self.node.label}: {name}={exc}") from exc
        return ctype

    def states(self) -> dict[str, ZSetState]:
        values = {f"value_states.{self.value_index[c]}": state
                  for c, state in self.value_states.items()}
        return {"acc_state": self.acc_state, **values}

    def state_layout(self) -> str:
        """The accumulators' ids by state column (an exact sum's parts changed with the
        version of the engine: txstream.engine.exact_sums)."""
        return " ".join(f"{name}={acc}" for acc, name in self.acc_names.items())

    def key(self, inputs: Sequence[Key]) -> Key:
        """The group-by columns: one row per group."""
        return tuple(self.node.keys)

    def _key_window(self, extra: Sequence[str] = ()) -> Window:
        return Window.partitionBy(*[col(c) for c in [*self.keys, *extra]]).orderBy(col(TIME))

    # Expressions that depend only on the node, made once: each costs round trips to the JVM,
    # and a batch's plans would otherwise build them all again.

    @cached_property
    def _accumulate(self) -> list[Column]:
        return [F.sum(col(DIFF)).alias(ROW_COUNT),
                *[F.sum(e).alias(name) for name, e in self.acc_exprs.items()]]

    @cached_property
    def _per_row(self) -> list[Column]:
        """Each input row's accumulators, in the types of their sums (`_accumulate`), which
        fix the state's row type."""
        changes = [StructField(c, LongType(), False) for c in (TIME, DIFF)]
        empty = self._empty(StructType([*self.input_schemas[0].fields, *changes]))
        summed = empty.agg(*self._accumulate).schema
        return [col(DIFF).cast(summed[ROW_COUNT].dataType).alias(ROW_COUNT),
                *[e.cast(summed[name].dataType).alias(name)
                  for name, e in self.acc_exprs.items()]]

    @cached_property
    def _value_names(self) -> list[str]:
        """The row's columns besides the group's keys: what a change of the group changes."""
        return [n for n in self.columns if n not in self.keys]

    @cached_property
    def _linear(self) -> bool:
        """Whether a group's row is a function of its summed accumulators alone (no min, max
        or count_distinct): then the row before each transaction comes from the sums over the
        rows before it, computed by the window that computes the running sums. Otherwise it
        is the previous row of a second window."""
        return not self.value_states

    @cached_property
    def _running(self) -> list[Column]:
        """Per row of a group's timeline, the group's accumulators summed through the row's
        time (a range frame: every row of that time counted), and whether the row is the
        time's last (`_LAST`), the one kept of that time. So the timeline may hold the input's
        rows as they come, several per group and time, with no aggregate by (group, time)
        before the window, whose hash map would be the batch's largest (a million entries when
        each of 10,000 groups changes in each of 100 transactions: that batch's job a quarter
        faster without). Downstream of a join the rows are aggregated first (`plan`)."""
        window = self._key_window()
        through = window.rangeBetween(Window.unboundedPreceding, Window.currentRow)
        sums = [F.sum(col(a)).over(through).alias(a) for a in self.acc_cols]
        if self._linear:
            # Spark adds the same rows in the same order as for the previous time's running
            # sums: the same value, to the last bit of a double.
            before = window.rangeBetween(Window.unboundedPreceding, -1)
            sums += [F.sum(col(a)).over(before).alias(f"{BEFORE}{a}") for a in self.acc_cols]
        following = F.lead(col(TIME)).over(window)
        last = following.isNull() | (following != col(TIME))
        return [*[col(k) for k in self.keys], col(TIME), *sums, last.alias(_LAST)]

    @cached_property
    def _previous(self) -> Column:
        """Each row of a group's timeline with the row before it, as PREVIOUS (the changes
        below read it field by field; Spark would evaluate a window function once per
        reference): a group with no row before has a row count of 0, or none at all."""
        if self._linear:
            count = F.coalesce(col(f"{BEFORE}{ROW_COUNT}"), F.lit(0).cast("long"))
            values = self._output_columns(prefix=BEFORE)
            return F.struct(count.alias(ROW_COUNT), *values).alias(PREVIOUS)
        return F.lag(F.struct(col(ROW_COUNT), *[col(n) for n in self._value_names])) \
            .over(self._key_window()).alias(PREVIOUS)

    @cached_property
    def _changes(self) -> list[Column]:
        """Per row of a group's timeline (the row before the batch first, then its row after
        each transaction), the changes since the previous row as a pair (`pairs`): the keys,
        the time, whether that row is retracted and this one inserted (neither when the two
        rows are equal), that row's values (prefixed OLD) and this one's."""
        value_names = self._value_names
        prev = col(PREVIOUS)
        was = prev.isNotNull() & (prev[ROW_COUNT] > 0)
        now = col(ROW_COUNT) > 0
        # Null-safe: a null value equal to a null value is an unchanged row.
        same = was & now & F.struct(*[col(n) for n in value_names]).eqNullSafe(
            F.struct(*[prev[n].alias(n) for n in value_names]))
        return [*[col(k) for k in self.keys], col(TIME), (was & ~same).alias(RETRACT),
                (now & ~same).alias(INSERT), *[prev[n].alias(f"{OLD}{n}") for n in value_names],
                *[col(n) for n in value_names]]

    @cached_property
    def _split(self) -> Column:
        """A pair's retraction and insertion, each a struct of the output's columns with time
        and diff, in an array (null where there is none)."""
        keys, value_names = self.keys, self._value_names

        def change(prefix: str, diff: int) -> Column:
            # Named, not cast to a struct type: a cast copies every field of every row.
            return F.struct(*[col(k).alias(k) for k in keys],
                            *[col(f"{prefix}{n}").alias(n) for n in value_names],
                            col(TIME).alias(TIME), F.lit(diff).cast("long").alias(DIFF))

        return F.array(F.when(col(RETRACT), change(OLD, -1)),
                       F.when(col(INSERT), change("", 1))).alias(CHANGES)

    def pairs(self) -> Pairs:
        return Pairs(tuple(self.keys), tuple(self._value_names))

    @cached_property
    def _new_row(self) -> list[Column]:
        new = [*[col(k) for k in self.keys], col(TIME), col(ROW_COUNT), *self._output_columns()]
        return [*new, self._previous] if self._linear else new

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [tuple(self.keys)]

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        """The keys and the reducers' columns, whatever its readers read."""
        fate = [FATE] if self.temporal else []
        return [frozenset(self.keys).union(
            fate, (red.column for _, red in self.node.reducers if red.column is not None))]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        if self.temporal:
            d = d.where(col(FATE) != LATE)
        keys = self.keys
        key_cols = [col(k) for k in keys]
        # At P > 1 everything below is partitioned by the group keys, as the states are. A
        # delta clustered by some of the keys already (a join's output by the join key) is
        # aggregated where it is, and only its accumulators are exchanged: a group's rows all
        # share those keys' values, and there are far fewer accumulators than rows. Not when
        # min, max or count_distinct read its values: those rows are exchanged anyway.
        # Downstream of a join, a group's rows of one transaction can be many (a customer's
        # change pairs with every order of it): they are aggregated by group and time before
        # the window sorts them (the example pipeline's ~480,000 pairs a batch sorted whole
        # made it 12-20% slower at P = 1).
        known = batch.clustering_of(d)
        in_place = not self.value_states and known is not None and set(known) < set(keys)
        if not in_place:
            d = batch.clustered(d, keys)
        fate = [col(FATE)] if self.temporal else []
        rows = (d.groupBy(*key_cols, col(TIME), *fate).agg(*self._accumulate)
                if in_place or self.many_per_key
                else d.select(*key_cols, col(TIME), *fate, *self._per_row))
        acc_delta = (batch.clustered(rows, keys) if in_place
                     else batch.shared(rows, clustered_by=keys))
        shown, kept = self._shown_and_kept(acc_delta, batch)
        touched = batch.shared(shown.select(*key_cols).distinct(), clustered_by=keys)

        # Running accumulators: the state's totals at BEFORE_BATCH, then the batch's rows (in
        # place: their sums by group and time).
        timeline = shown
        base = self.acc_state.lookup(touched, keys, batch.parallelism)
        if base is not None:
            timeline = timeline.unionByName(base.withColumn(TIME, F.lit(BEFORE_BATCH)))
        groups = timeline.select(*self._running).where(col(_LAST)).drop(_LAST)

        for column in self.value_states:
            groups = self._with_values(groups, d, touched, column, batch)

        batch.append(self.acc_state, kept)
        return self._emit(groups.select(*self._new_row))

    def _shown_and_kept(self, changes: DataFrame, batch: BatchPlan
                        ) -> tuple[DataFrame, DataFrame]:
        """Of a batch's `changes`, those its output shows and those its state keeps (see the
        module doc; a join after a behavior reads the fates alike), without `FATE`; both all
        of them without a temporal behavior."""
        if not self.temporal:
            return changes, changes
        return shown_and_kept(changes, batch)

    def _with_values(self, groups: DataFrame, d: DataFrame, touched: DataFrame, column: str,
                     batch: BatchPlan) -> DataFrame:
        """Add `value_stats(i)` of `column` (value column number i): the min, max and distinct
        count of its non-null values in each group at each time of `groups` (before the batch,
        then after each of its transactions)."""
        keys = self.keys
        key_cols = [col(k) for k in keys]
        state = self.value_states[column]
        fate = [FATE] if self.temporal else []
        changed = batch.shared(consolidate(
            d.where(col(column).isNotNull()).select(*key_cols, col(column).alias(VALUE),
                                                   *[col(c) for c in fate], col(TIME),
                                                   col(DIFF)),
            [*keys, VALUE, *fate],
        ), clustered_by=keys)
        vd, kept = self._shown_and_kept(changed, batch)
        touched_values = vd.select(*key_cols, col(VALUE)).distinct()

        # The state's values of the touched groups, split in two: values the batch does not
        # touch are constant over it (one min/max/count per group); touched values start the
        # batch with their current count. One scan of the state serves both, and one
        # aggregate by (keys, value) tags each value touched or not: it groups nulls with
        # nulls as the keys must match, and it needs the group's values exchanged at most
        # once (none when they are partitioned by the keys already), where a semi join and an
        # anti join on null-safe keys exchanged all of them twice.
        current = state.lookup(touched, keys, batch.parallelism)
        steady = before = None
        if current is not None:
            tagged = batch.shared(
                current.select(*key_cols, col(VALUE), col(DIFF), F.lit(False).alias(_HIT))
                .unionByName(touched_values.select(*key_cols, col(VALUE),
                                                   F.lit(0).cast("long").alias(DIFF),
                                                   F.lit(True).alias(_HIT)))
                .groupBy(*key_cols, col(VALUE))
                .agg(F.sum(col(DIFF)).alias(DIFF), F.max(col(_HIT)).alias(_HIT)),
                clustered_by=keys)
            steady = tagged.where(~col(_HIT)).groupBy(*key_cols).agg(
                *_stats(F.col(VALUE), STEADY_STATS))
            # `current` holds no zero counts: a touched value with one was in the state.
            before = tagged.where(col(_HIT) & (col(DIFF) != 0)).select(
                *key_cols, col(VALUE), col(DIFF))

        # Touched values: their count over the batch as intervals [FROM, UNTIL).
        vtimeline = vd
        if before is not None:
            vtimeline = vtimeline.unionByName(before.withColumn(TIME, F.lit(BEFORE_BATCH)))
        w = self._key_window([VALUE])
        intervals = vtimeline.select(
            *key_cols, col(VALUE),
            col(TIME).alias(FROM),
            F.lead(col(TIME), 1, _FOREVER).over(w).alias(UNTIL),
            F.sum(col(DIFF)).over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
            .alias(COUNT),
        ).where(col(COUNT) > 0)
        iv = prefixed(intervals, INTERVALS)
        queries = build_side(groups.select(*key_cols, col(TIME)))
        present = join(
            queries, iv,
            null_safe_on(queries, iv, keys, [f"{INTERVALS}{k}" for k in keys])
            & (iv[f"{INTERVALS}{FROM}"] <= queries[TIME])
            & (queries[TIME] < iv[f"{INTERVALS}{UNTIL}"]),
            "inner", batch.parallelism,
        ).groupBy(*[queries[f"`{k}`"] for k in keys], queries[TIME]).agg(
            *_stats(F.col(f"{INTERVALS}{VALUE}"), TOUCHED_STATS))
        p = build_side(prefixed(present, PRESENT))
        joined = join(
            groups, p,
            null_safe_on(groups, p, [*keys, TIME], [f"{PRESENT}{c}" for c in [*keys, TIME]]),
            "left", batch.parallelism,
        )
        low, high, count = [F.col(f"{PRESENT}{n}") for n in TOUCHED_STATS]
        if steady is not None:
            q = build_side(prefixed(steady, STEADY))
            joined = join(
                joined, q, null_safe_on(joined, q, keys, [f"{STEADY}{k}" for k in keys]), "left",
                batch.parallelism,
            )
            steady_low, steady_high, steady_count = [F.col(f"{STEADY}{n}") for n in STEADY_STATS]
            low, high = F.least(low, steady_low), F.greatest(high, steady_high)
            count = F.coalesce(count, F.lit(0)) + F.coalesce(steady_count, F.lit(0))
        batch.append(state, kept)
        names = value_stats(self.value_index[column])
        return joined.select(
            *[groups[f"`{c}`"] for c in groups.columns],
            low.alias(names[0]), high.alias(names[1]),
            F.coalesce(count, F.lit(0)).cast("long").alias(names[2]),
        )

    def _output_columns(self, prefix: str = "") -> list[Column]:
        """The reducers' values from the accumulators named with `prefix`."""
        def acc(accumulator: str) -> Column:
            name = ROW_COUNT if accumulator == ROW_COUNT else self.acc_names[accumulator]
            return col(prefix + name)

        exprs = []
        for name, red in self.node.reducers:
            values = None
            if red.needs_values:
                i = self.value_index[red.column]  # type: ignore[index]
                values = ValueStats(*[col(n) for n in value_stats(i)])
            value = red.value(self.column_types[name], acc, values)
            exprs.append(value.cast(self.schema[name].dataType).alias(name))
        return exprs

    def _emit(self, rows: DataFrame) -> DataFrame:
        """The changes between consecutive rows of each group's timeline, at the later row's
        time: a group's row is emitted once per transaction at most, and the row before the
        batch only serves to retract what was last emitted. As pairs when `emit_pairs`."""
        if not self._linear:
            rows = rows.select("*", self._previous)
        pairs = rows.select(*self._changes).where(
            (col(TIME) != BEFORE_BATCH) & (col(RETRACT) | col(INSERT)))
        if self.emit_pairs:
            return pairs
        return pairs.select(F.inline(F.filter(self._split, lambda c: c.isNotNull())))
