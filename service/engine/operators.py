"""The incremental operators: one class per DAG node kind.

Every operator maps its inputs' delta DataFrames (the node's columns plus `time`, `diff`; a
batch may hold many consecutive transactions) to its own delta, consolidated, and keeps the
state it needs between batches. A delta of `None` is known to be empty, so work is skipped
without running a Spark job to find out. The output of each transaction in a batch is exactly
what processing that transaction alone would emit: operators order by `time` wherever the
result depends on history (running sums, multiplicity crossings, min/max over time).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from schemas.tables import RESERVED_COLUMNS, ColumnType, TableSchemaError
from service.engine.errors import PipelineDefinitionError
from service.engine.frames import (
    DIFF,
    TIME,
    col,
    consolidate,
    null_safe_on,
    prefixed,
    union_all,
)
from service.engine.reducers import Reducer, ReducerKind
from service.engine.state import ZSetState
from service.engine.table import (
    ConcatNode,
    DistinctNode,
    FilterNode,
    JoinNode,
    NegateNode,
    Node,
    PadNode,
    ReduceNode,
    SelectNode,
    SourceNode,
)

Delta = DataFrame | None
BEFORE_BATCH = -1  # the time given to state rows: earlier than every transaction


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


INTERNAL_PREFIX = "__"  # the operators' helper columns; user columns may not start with it
# Functions whose value depends on when a batch runs: a retraction would not match its insertion.
_TIME_DEPENDENT = ("current_timestamp", "current_date", "now(", "localtimestamp",
                   "unix_timestamp()", "current_time")


def _check_columns(node: Node, schema: StructType) -> StructType:
    """Every column of a table: a supported type, not a reserved name, unique ignoring case
    (Spark resolves names case-insensitively)."""
    seen: dict[str, str] = {}
    for f in schema.fields:
        if f.name.lower() in RESERVED_COLUMNS:
            raise PipelineDefinitionError(
                f"{node.label}: column {f.name!r} is reserved for change metadata; rename it")
        if f.name.startswith(INTERNAL_PREFIX):
            raise PipelineDefinitionError(
                f"{node.label}: column {f.name!r}: names starting with {INTERNAL_PREFIX!r} are "
                "reserved for the engine; rename it")
        other = seen.setdefault(f.name.lower(), f.name)
        if other != f.name:
            raise PipelineDefinitionError(
                f"{node.label}: columns {other!r} and {f.name!r} differ only in case, which "
                "Spark does not tell apart; rename one")
        try:
            ColumnType.from_spark(f.dataType.simpleString())
        except TableSchemaError as exc:
            raise PipelineDefinitionError(f"{node.label}: column {f.name!r}: {exc}") from exc
    return StructType([StructField(f.name, f.dataType, True) for f in schema.fields])


def _check_row_wise(node: Node, frame: DataFrame, exprs: Sequence[str], operator: str) -> None:
    """An expression must map each row on its own, the same way in every batch: changes are
    processed a batch at a time and retractions must cancel their insertions exactly.

    Spark's analyzed plan shows it: exactly one `operator` (Project, Filter) over the input,
    and deterministic."""
    plan = frame._jdf.queryExecution().analyzed()
    shown = "; ".join(exprs)
    if plan.nodeName() != operator or plan.apply(2) is not None:
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: aggregate and window functions are not row-wise; use "
            "groupby(...).reduce(...) instead")
    if not plan.deterministic():
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: non-deterministic expressions (rand(), uuid(), ...) cannot "
            "be maintained incrementally")
    text = shown.lower().replace(" ", "")
    used = [f for f in _TIME_DEPENDENT if f in text]
    if used:
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: {used[0].rstrip('(')} depends on when a batch runs, so a "
            "deletion would not retract its insertion; carry the time in a source column")


class Operator(ABC):
    def __init__(self, spark: SparkSession, node: Node, inputs: Sequence[StructType]) -> None:
        self.spark = spark
        self.node = node
        self.input_schemas = list(inputs)
        self.schema = _check_columns(node, self._resolve())
        # Rows of input in the current batch, set by the engine: the weight of state appends.
        self.batch_rows = 1

    @staticmethod
    def _shared(frame: DataFrame) -> DataFrame:
        """A frame used several times: computed once, by the first job that needs it, and seen
        by later plans as a leaf, so they do not re-analyze (or recompute) its lineage."""
        return frame.localCheckpoint(eager=False)

    @staticmethod
    def _materialized(frame: DataFrame) -> DataFrame:
        """Compute a frame now and cut its lineage: plans built on it stay small, and branches
        that share it do not recompute it."""
        return frame.localCheckpoint(eager=True)

    @property
    def columns(self) -> list[str]:
        return self.schema.names

    def _empty(self, schema: StructType) -> DataFrame:
        return self.spark.createDataFrame([], schema)

    def _require(self, schema: StructType, names: Sequence[str], what: str) -> None:
        missing = [n for n in names if n not in schema.names]
        if missing:
            raise PipelineDefinitionError(
                f"{self.node.label}: {what} column(s) {', '.join(missing)} not found; "
                f"available: {', '.join(schema.names)}"
            )

    def states(self) -> dict[str, ZSetState]:
        """The operator's state by stable name (for checkpoints); empty when stateless."""
        return {name: value for name, value in vars(self).items()
                if isinstance(value, ZSetState)}

    @abstractmethod
    def _resolve(self) -> StructType:
        """The output schema, checked against the inputs' schemas (raises on a bad definition)."""

    @abstractmethod
    def step(self, deltas: Sequence[Delta]) -> Delta:
        """The output delta of one batch, given the inputs' deltas; updates the state."""


class SourceOp(Operator):
    def _resolve(self) -> StructType:
        assert isinstance(self.node, SourceNode) and self.node.schema is not None
        return StructType.fromDDL(self.node.schema.spark_ddl())

    def step(self, deltas: Sequence[Delta]) -> Delta:
        return deltas[0]


class SelectOp(Operator):
    node: SelectNode

    def _exprs(self) -> list[str]:
        return [f"{expr} AS `{name}`" for name, expr in self.node.exprs]

    def _resolve(self) -> StructType:
        try:
            frame = self._empty(self.input_schemas[0]).selectExpr(*self._exprs())
        except Exception as exc:  # analysis and parse errors, as pyspark exceptions
            raise PipelineDefinitionError(f"{self.node.label}: {_first_line(exc)}") from exc
        _check_row_wise(self.node, frame, [e for _, e in self.node.exprs], "Project")
        return frame.schema

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        # A projection can map distinct rows to one row: consolidate.
        return consolidate(d.selectExpr(*self._exprs(), TIME, DIFF), self.columns)


class FilterOp(Operator):
    node: FilterNode

    def _resolve(self) -> StructType:
        empty = self._empty(self.input_schemas[0])
        try:
            typed = empty.selectExpr(f"({self.node.predicate}) AS p").schema["p"].dataType
            filtered = empty.where(self.node.predicate)
        except Exception as exc:
            raise PipelineDefinitionError(f"{self.node.label}: {_first_line(exc)}") from exc
        _check_row_wise(self.node, filtered, [self.node.predicate], "Filter")
        if typed.simpleString() != "boolean":
            raise PipelineDefinitionError(
                f"{self.node.label}: the predicate is {typed.simpleString()}, not boolean"
            )
        return self.input_schemas[0]

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        return None if d is None else d.where(self.node.predicate)


class NegateOp(Operator):
    def _resolve(self) -> StructType:
        return self.input_schemas[0]

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        return None if d is None else d.withColumn(DIFF, -col(DIFF))


class ConcatOp(Operator):
    """Union all. Inputs need the same column names and types; order is the first input's."""

    def _resolve(self) -> StructType:
        first = self.input_schemas[0]
        want = {f.name: f.dataType.simpleString() for f in first.fields}
        for other in self.input_schemas[1:]:
            got = {f.name: f.dataType.simpleString() for f in other.fields}
            if got != want:
                raise PipelineDefinitionError(
                    f"{self.node.label}: inputs differ in columns or types: "
                    f"{sorted(want.items())} vs {sorted(got.items())}"
                )
        return first

    def step(self, deltas: Sequence[Delta]) -> Delta:
        present = [d.select(*[col(c) for c in self.columns], col(TIME), col(DIFF))
                   for d in deltas if d is not None]
        if not present:
            return None
        return consolidate(union_all(present), self.columns)


class _JoinLayout:
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
    """Inner equi-join: d(A join B) = dA join (B + dB) + A join dB, time = later of the two,
    diff = product. State: both sides' Z-sets."""

    node: JoinNode

    def _resolve(self) -> StructType:
        self.layout = _JoinLayout(self, self.input_schemas[0], self.input_schemas[1], self.node.on)
        self.left_state = ZSetState(self.input_schemas[0].names, [DIFF])
        self.right_state = ZSetState(self.input_schemas[1].names, [DIFF])
        return self.layout.schema

    def _pairs(self, left: DataFrame, right: DataFrame, broadcast: str) -> DataFrame:
        lay = self.layout
        r = prefixed(right, "__r_")
        if broadcast == "left":
            left = F.broadcast(left)
        else:
            r = F.broadcast(r)
        cond = [left[f"`{k}`"] == r[f"`__r_{k}`"] for k in lay.on]
        return left.join(r, cond, "inner").select(
            *[left[f"`{c}`"] for c in lay.on + lay.left_rest],
            *[r[f"`__r_{c}`"].alias(c) for c in lay.right_rest],
            F.greatest(left[TIME], r[f"__r_{TIME}"]).alias(TIME),
            (left[DIFF] * r[f"__r_{DIFF}"]).alias(DIFF),
        )

    @staticmethod
    def _as_before_batch(state: ZSetState) -> DataFrame | None:
        frame = state.frame()
        return None if frame is None else frame.withColumn(TIME, F.lit(BEFORE_BATCH).cast("long"))

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d_left, d_right = deltas
        if d_left is None and d_right is None:
            return None
        left_before = self._as_before_batch(self.left_state)
        right_before = self._as_before_batch(self.right_state)
        terms: list[DataFrame] = []
        if d_left is not None:
            right_all = [f for f in (right_before, d_right) if f is not None]
            if right_all:
                terms.append(self._pairs(d_left, union_all(right_all), broadcast="left"))
        if d_right is not None and left_before is not None:
            terms.append(self._pairs(left_before, d_right, broadcast="right"))
        if d_left is not None:
            self.left_state.append(d_left, self.batch_rows)
        if d_right is not None:
            self.right_state.append(d_right, self.batch_rows)
        if not terms:
            return None
        return consolidate(union_all(terms), self.columns)


class PadOp(Operator):
    """Rows of one join side with the other side's columns null (the outer part of a join)."""

    node: PadNode

    def _resolve(self) -> StructType:
        side, other = self.input_schemas
        left, right = (side, other) if self.node.side == "left" else (other, side)
        self.layout = _JoinLayout(self, left, right, self.node.on)
        return self.layout.schema

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        own = set(self.input_schemas[0].names)
        return d.select(
            *[col(f.name) if f.name in own else F.lit(None).cast(f.dataType).alias(f.name)
              for f in self.schema.fields],
            col(TIME), col(DIFF),
        )


class DistinctOp(Operator):
    """A row is in the output while its multiplicity is positive: emit on crossings of 0."""

    def _resolve(self) -> StructType:
        self.state = ZSetState(self.input_schemas[0].names, [DIFF])
        return self.input_schemas[0]

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        cols = self.columns
        before = self.state.lookup(d, cols)
        timeline = d.select(*[col(c) for c in cols], col(TIME), col(DIFF))
        if before is not None:
            timeline = timeline.unionByName(before.withColumn(TIME, F.lit(BEFORE_BATCH)))
        w = (Window.partitionBy(*[col(c) for c in cols]).orderBy(col(TIME))
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
        counted = timeline.withColumn("__after", F.sum(col(DIFF)).over(w))
        crossings = counted.where(
            (col(TIME) != BEFORE_BATCH)
            & ((col("__after") > 0) != ((col("__after") - col(DIFF)) > 0))
        ).select(
            *[col(c) for c in cols], col(TIME),
            F.when(col("__after") > 0, F.lit(1)).otherwise(F.lit(-1)).cast("long").alias(DIFF),
        )
        self.state.append(d, self.batch_rows)
        return crossings


class ReduceOp(Operator):
    """Group-by/reduce. Per touched group and transaction: retract the old aggregate row,
    insert the new one.

    State: running accumulators per group (row count, sums and non-null counts: linear), the
    multiset of values per group for min/max/count_distinct, and the rows last emitted, which
    are what gets retracted (so float sums need not reproduce a value bit for bit).
    """

    node: ReduceNode

    def _resolve(self) -> StructType:
        src = self.input_schemas[0]
        keys = list(self.node.keys)
        self._require(src, keys, "group-by")
        self.keys = keys
        sum_cols: list[str] = []
        nn_cols: list[str] = []
        value_cols: list[str] = []
        fields = [src[k] for k in keys]
        for name, red in self.node.reducers:
            fields.append(StructField(name, self._reducer_type(name, red, src), True))
            if red.column is None:
                continue
            if red.kind in (ReducerKind.SUM, ReducerKind.AVG) and red.column not in sum_cols:
                sum_cols.append(red.column)
            if red.kind in (ReducerKind.COUNT, ReducerKind.SUM, ReducerKind.AVG) \
                    and red.column not in nn_cols:
                nn_cols.append(red.column)
            if red.needs_values and red.column not in value_cols:
                value_cols.append(red.column)
        self.sum_names = {c: f"__s{i}" for i, c in enumerate(sum_cols)}
        self.nn_names = {c: f"__n{i}" for i, c in enumerate(nn_cols)}
        self.value_names = {c: i for i, c in enumerate(value_cols)}
        self.acc_cols = ["__cnt", *self.sum_names.values(), *self.nn_names.values()]
        self.acc_state = ZSetState(keys, self.acc_cols, empty_when="`__cnt` = 0")
        self.value_states = {c: ZSetState([*keys, "__v"], [DIFF]) for c in value_cols}
        out_schema = StructType(fields)
        self.out_state = ZSetState(out_schema.names, [DIFF])
        return out_schema

    def states(self) -> dict[str, ZSetState]:
        values = {f"value_states.{self.value_names[c]}": state
                  for c, state in self.value_states.items()}
        return {**super().states(), **values}

    def _reducer_type(self, name: str, red: Reducer, src: StructType):  # type: ignore[no-untyped-def]
        from pyspark.sql.types import DoubleType, LongType

        if red.column is None:
            if red.kind is not ReducerKind.COUNT:
                raise PipelineDefinitionError(f"{self.node.label}: {name}={red} needs a column")
            return LongType()
        self._require(src, [red.column], f"reducer {name}={red}")
        ctype = ColumnType.from_spark(src[red.column].dataType.simpleString())
        if red.needs_numeric and not ctype.is_numeric:
            raise PipelineDefinitionError(
                f"{self.node.label}: {name}={red} needs a numeric column, but {red.column!r} "
                f"is {ctype.value}"
            )
        if red.kind in (ReducerKind.COUNT, ReducerKind.COUNT_DISTINCT):
            return LongType()
        if red.kind is ReducerKind.AVG:
            return DoubleType()
        if red.kind is ReducerKind.SUM:
            return DoubleType() if ctype is ColumnType.DOUBLE else LongType()
        return src[red.column].dataType

    def _key_window(self, extra: Sequence[str] = ()) -> Window:
        return Window.partitionBy(*[col(c) for c in [*self.keys, *extra]]).orderBy(col(TIME))

    def step(self, deltas: Sequence[Delta]) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        keys = self.keys
        key_cols = [col(k) for k in keys]
        acc_delta = d.groupBy(*key_cols, col(TIME)).agg(
            F.sum(col(DIFF)).alias("__cnt"),
            *[F.coalesce(F.sum(F.when(col(c).isNotNull(), col(c) * col(DIFF))), F.lit(0))
              .alias(n) for c, n in self.sum_names.items()],
            *[F.sum(F.when(col(c).isNotNull(), col(DIFF)).otherwise(0)).alias(n)
              for c, n in self.nn_names.items()],
        )
        acc_delta = self._shared(acc_delta)
        touched = self._shared(acc_delta.select(*key_cols).distinct())

        # Running accumulators: the state's totals at BEFORE_BATCH, then each transaction's delta.
        timeline = acc_delta
        base = self.acc_state.lookup(touched, keys)
        if base is not None:
            timeline = timeline.unionByName(base.withColumn(TIME, F.lit(BEFORE_BATCH)))
        running = self._key_window().rowsBetween(Window.unboundedPreceding, Window.currentRow)
        groups = timeline.select(
            *key_cols, col(TIME), *[F.sum(col(a)).over(running).alias(a) for a in self.acc_cols]
        ).where(col(TIME) != BEFORE_BATCH)

        for column, idx in self.value_names.items():
            groups = self._with_values(groups, d, touched, column, idx)

        outputs = self._output_columns()
        new_rows = self._materialized(
            groups.select(*key_cols, col(TIME), col("__cnt"), *outputs))
        out = self._shared(self._emit(new_rows, touched))
        self.acc_state.append(acc_delta, self.batch_rows)
        self.out_state.append(out, self.batch_rows)
        return out

    def _with_values(self, groups: DataFrame, d: DataFrame, touched: DataFrame, column: str,
                     idx: int) -> DataFrame:
        """Add `__min{idx}`, `__max{idx}`, `__cd{idx}`: min, max and distinct count of `column`'s
        non-null values of each group at each transaction of the batch."""
        keys = self.keys
        state = self.value_states[column]
        vd = consolidate(
            d.where(col(column).isNotNull()).select(*[col(k) for k in keys],
                                                   col(column).alias("__v"), col(TIME),
                                                   col(DIFF)),
            [*keys, "__v"],
        )
        vd = self._shared(vd)
        touched_values = vd.select(*[col(k) for k in keys], col("__v")).distinct()

        # The state's values of the touched groups, split in two: values the batch does not
        # touch are constant over it (one min/max/count per group); touched values start the
        # batch with their current count. One scan of the state serves both.
        current = state.lookup(touched, keys)
        steady = before = None
        if current is not None:
            current = self._shared(current)
            tv = prefixed(touched_values, "__t_")
            on = null_safe_on(current, tv, [*keys, "__v"], [f"__t_{c}" for c in [*keys, "__v"]])
            steady = current.join(tv, on, "left_anti").groupBy(*[col(k) for k in keys]).agg(
                F.min("__v").alias("__smin"), F.max("__v").alias("__smax"),
                F.count(F.lit(1)).alias("__scnt"),
            )
            before = current.join(tv, on, "left_semi")

        # Touched values: their count over the batch as intervals [start, end).
        vtimeline = vd
        if before is not None:
            vtimeline = vtimeline.unionByName(before.withColumn(TIME, F.lit(BEFORE_BATCH)))
        w = self._key_window(["__v"])
        intervals = vtimeline.select(
            *[col(k) for k in keys], col("__v"),
            col(TIME).alias("__start"),
            F.lead(col(TIME), 1, 2**62).over(w).alias("__end"),
            F.sum(col(DIFF)).over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
            .alias("__c"),
        ).where(col("__c") > 0)
        iv = prefixed(intervals, "__i_")
        queries = groups.select(*[col(k) for k in keys], col(TIME))
        present = queries.join(
            iv,
            null_safe_on(queries, iv, keys, [f"__i_{k}" for k in keys])
            & (iv["__i___start"] <= queries[TIME]) & (queries[TIME] < iv["__i___end"]),
            "inner",
        ).groupBy(*[queries[f"`{k}`"] for k in keys], queries[TIME]).agg(
            F.min("__i___v").alias("__tmin"), F.max("__i___v").alias("__tmax"),
            F.count(F.lit(1)).alias("__tcnt"),
        )
        p = prefixed(present, "__p_")
        joined = groups.join(
            p,
            null_safe_on(groups, p, [*keys, TIME], [f"__p_{c}" for c in [*keys, TIME]]),
            "left",
        )
        stats = [F.col("__p___tmin"), F.col("__p___tmax"), F.col("__p___tcnt")]
        if steady is not None:
            s = prefixed(steady, "__q_")
            joined = joined.join(
                s, null_safe_on(joined, s, keys, [f"__q_{k}" for k in keys]), "left"
            )
            stats = [
                F.least(F.col("__p___tmin"), F.col("__q___smin")),
                F.greatest(F.col("__p___tmax"), F.col("__q___smax")),
                F.coalesce(F.col("__p___tcnt"), F.lit(0))
                + F.coalesce(F.col("__q___scnt"), F.lit(0)),
            ]
        state.append(vd, self.batch_rows)
        return joined.select(
            *[groups[f"`{c}`"] for c in groups.columns],
            stats[0].alias(f"__min{idx}"), stats[1].alias(f"__max{idx}"),
            F.coalesce(stats[2], F.lit(0)).cast("long").alias(f"__cd{idx}"),
        )

    def _output_columns(self) -> list:  # type: ignore[type-arg]
        exprs = []
        for name, red in self.node.reducers:
            c = red.column
            if red.kind is ReducerKind.COUNT:
                e = col("__cnt") if c is None else col(self.nn_names[c])
            elif red.kind is ReducerKind.SUM:
                e = F.when(col(self.nn_names[c]) > 0, col(self.sum_names[c]))
            elif red.kind is ReducerKind.AVG:
                e = F.when(col(self.nn_names[c]) > 0,
                           col(self.sum_names[c]) / col(self.nn_names[c]))
            elif red.kind is ReducerKind.MIN:
                e = col(f"__min{self.value_names[c]}")
            elif red.kind is ReducerKind.MAX:
                e = col(f"__max{self.value_names[c]}")
            else:
                e = col(f"__cd{self.value_names[c]}")
            exprs.append(e.cast(self.schema[name].dataType).alias(name))
        return exprs

    def _emit(self, new_rows: DataFrame, touched: DataFrame) -> DataFrame:
        """+1 for each group's row after each transaction, -1 for its row before it.

        The row before a group's first transaction in the batch is the one last emitted (from
        `out_state`); before a later one, the previous transaction's new row.
        """
        keys = self.keys
        names = self.columns
        value_names = [n for n in names if n not in keys]
        w = self._key_window()
        prev = F.lag(F.struct(col("__cnt"), *[col(n) for n in value_names])).over(w)
        ordered = new_rows.select("*", prev.alias("__prev"),
                                  F.row_number().over(w).alias("__rank"))
        adds = ordered.where(col("__cnt") > 0).select(
            *[col(n) for n in names], col(TIME), F.lit(1).cast("long").alias(DIFF))
        retracts = ordered.where(col("__prev").isNotNull() & (F.col("__prev.__cnt") > 0)).select(
            *[col(k) for k in keys], *[F.col(f"__prev.`{n}`").alias(n) for n in value_names],
            col(TIME), F.lit(-1).cast("long").alias(DIFF))
        parts = [adds, retracts]
        last = self.out_state.lookup(touched, keys)
        if last is not None:
            firsts = prefixed(ordered.where(col("__rank") == 1).select(*[col(k) for k in keys],
                                                                      col(TIME)), "__f_")
            parts.append(last.join(
                firsts, null_safe_on(last, firsts, keys, [f"__f_{k}" for k in keys]), "inner",
            ).select(*[col(n) for n in names], col(f"__f_{TIME}").alias(TIME),
                     (-col(DIFF)).alias(DIFF)))
        return consolidate(union_all(parts), names)


OPERATORS: dict[type[Node], type[Operator]] = {
    SourceNode: SourceOp,
    SelectNode: SelectOp,
    FilterNode: FilterOp,
    NegateNode: NegateOp,
    ConcatNode: ConcatOp,
    JoinNode: JoinOp,
    PadNode: PadOp,
    DistinctNode: DistinctOp,
    ReduceNode: ReduceOp,
}
