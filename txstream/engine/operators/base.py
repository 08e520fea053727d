"""What every operator is: a node's output schema, checked at build, and its incremental rule;
and what only it knows of its node, which the engine asks it: the columns unique in its output
(`key`), the user's SQL in it (`expressions`), and the state it keeps (`states`, declared by
name).

An operator's `plan` maps its inputs' delta DataFrames (the node's columns plus `time`, `diff`;
a batch may hold many consecutive transactions) to its own delta, and stages the state changes
it needs into the batch. It runs nothing: the engine decides when Spark computes. A delta of
`None` is known to be empty, so work is skipped without a Spark job to find out. The output of
each transaction in a batch is exactly what processing that transaction alone would emit:
operators order by `time` wherever the result depends on history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Collection, Sequence
from typing import ClassVar

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import INTERNAL_PREFIX
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.nodes import Node
from txstream.engine.results import Pairs
from txstream.engine.spark_internals import one_operator
from txstream.engine.state import StatePlacement, ZSetState
from txstream.schemas.tables import RESERVED_COLUMNS, ColumnType, TableSchemaError

Delta = DataFrame | None
# A set of columns that is unique in a table (see `Operator.key`), None when none is known.
Key = tuple[str, ...] | None
# Columns a delta is hash-partitioned by at parallelism above 1, None for none in particular.
Clustered = tuple[str, ...] | None

# Functions whose value depends on when a batch runs: a retraction would not match its insertion.
_TIME_DEPENDENT = ("current_timestamp", "current_date", "now(", "localtimestamp",
                   "unix_timestamp()", "current_time")


def first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _check_columns(node: Node, schema: StructType, engine_columns: frozenset[str]
                   ) -> StructType:
    """Every column of a table: a supported type, not a reserved name (but the `engine_columns`
    the operator itself adds), unique ignoring case (Spark resolves names case-insensitively)."""
    seen: dict[str, str] = {}
    for f in schema.fields:
        if f.name.lower() in RESERVED_COLUMNS:
            raise PipelineDefinitionError(
                f"{node.label}: column {f.name!r} is reserved for change metadata; rename it")
        if f.name.startswith(INTERNAL_PREFIX) and f.name not in engine_columns:
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


def column_names(expression: JavaObject) -> frozenset[str]:
    """The input columns a Catalyst expression of an analyzed plan reads."""
    attributes = expression.references().toSeq()
    return frozenset(attributes.apply(i).name() for i in range(attributes.size()))


def check_row_wise(node: Node, frame: DataFrame, exprs: Sequence[str], operator: str) -> None:
    """An expression must map each row on its own, the same way in every batch: changes are
    processed a batch at a time and retractions must cancel their insertions exactly.

    Spark's analyzed plan shows it: exactly one `operator` (Project, Filter) over the input,
    and deterministic."""
    alone, deterministic = one_operator(frame, operator)
    shown = "; ".join(exprs)
    if not alone:
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: aggregate and window functions are not row-wise; use "
            "groupby(...).reduce(...) instead")
    if not deterministic:
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: non-deterministic expressions (rand(), uuid(), ...) cannot "
            "be maintained incrementally")
    text = shown.lower().replace(" ", "")
    used = [f for f in _TIME_DEPENDENT if f in text]
    if used:
        raise PipelineDefinitionError(
            f"{node.label}: {shown}: {used[0].rstrip('(')} depends on when a batch runs, so a "
            "deletion would not retract its insertion; carry the time in a source column, or "
            "compare a column with now() in a filter, which is the transaction's wall time")


def check_predicate(node: Node, frame: DataFrame, predicate: str) -> DataFrame:
    """`frame` filtered by the Spark SQL `predicate`, which must analyze against it, be boolean
    and row-wise (`check_row_wise`): a definition error naming `node` otherwise."""
    try:
        typed = frame.selectExpr(f"({predicate}) AS p").schema["p"].dataType
        filtered = frame.where(predicate)
    except Exception as exc:
        raise PipelineDefinitionError(f"{node.label}: {first_line(exc)}") from exc
    check_row_wise(node, filtered, [predicate], "Filter")
    if typed.simpleString() != "boolean":
        raise PipelineDefinitionError(
            f"{node.label}: the predicate is {typed.simpleString()}, not boolean")
    return filtered


class Operator(ABC):
    # Whether the operator computes right from unconsolidated input changes (a row's changes
    # of one time in several rows, some of them cancelling): a group-by sums them by group and
    # time anyway, a join pairs them (bilinear), a select or a union consolidates its output
    # itself where that is needed. A distinct's crossings need each row's changes summed.
    reads_unconsolidated: ClassVar[bool] = False
    # Whether the operator passes its (first) input's rows through, row by row, without
    # consolidating (filter, negate, padding, a select that keeps every input column): that
    # input needs consolidating wherever its output does. An operator may set it per node.
    passes_through: bool = False
    # Whether a row of input can make many rows of output (a join: a row pairs with every
    # matching row of the other side), so that readers downstream may get many changes per
    # key and transaction (see `many_per_key`).
    multiplies_rows: ClassVar[bool] = False
    # Whether the output at a batch's end depends on how the batch's changes are cut into
    # transactions, not only on their sum (a temporal behavior's clock moves transaction by
    # transaction): a batch is then never computed as one netted transaction. An operator may
    # set it per node.
    sees_transactions: bool = False

    def __init__(self, spark: SparkSession, node: Node, inputs: Sequence[StructType],
                 placement: StatePlacement) -> None:
        self.spark = spark
        self.node = node
        self.input_schemas = list(inputs)
        # Where the runs of every state the operator keeps live (`_resolve` makes them).
        self.placement = placement
        self.schema = _check_columns(node, self._resolve(), self.engine_columns())
        # The columns readers of this operator's output cluster it by at parallelism above 1
        # (see `input_clustering`), those most readers want first; set by the engine once the
        # DAG is known. An operator that must exchange its output anyway (a consolidation)
        # exchanges it by those, so a reader needs no second exchange.
        self.readers_cluster_by: tuple[tuple[str, ...], ...] = ()
        # Whether the output must be consolidated: it is a pipeline's output, or a reader needs
        # it so (see `reads_unconsolidated`); set by the engine once the DAG is known.
        self.consolidate_output = True
        # Whether `plan` returns its changes as `pairs()` lays them out: set by the engine when
        # a pipeline's output is the one reader (txstream.engine.results).
        self.emit_pairs = False
        # Whether an input's changes may come many per key and transaction: it is downstream of
        # an operator that `multiplies_rows`; set by `tell_readers`.
        self.many_per_key = False
        # The columns of the output that its readers read (see `reads`); set by `tell_readers`.
        # A join leaves the others null, so that a change of those alone cancels before it
        # pairs (txstream.engine.operators.join).
        self.needed: frozenset[str] = frozenset(self.columns)

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

    def engine_columns(self) -> frozenset[str]:
        """Columns of the output named as the engine's helpers are (with `INTERNAL_PREFIX`),
        which the operator adds for its one reader to read (none, in the base class)."""
        return frozenset()

    def states(self) -> dict[str, ZSetState]:
        """The operator's state by name; empty when stateless (as the base class is).

        The names are part of a saved state's layout (a directory each): renaming one makes
        earlier checkpoints load that state empty, so they never change."""
        return {}

    def state_layout(self) -> str:
        """What the columns of the operator's states mean, where their names do not say it
        (empty when they do, as in the base class): part of what a saved state must match, so
        that a state saved in another layout is refused instead of misread."""
        return ""

    def key(self, inputs: Sequence[Key]) -> Key:
        """A set of columns that is unique in the output, given such a set of each input
        (None where none is known); None when the operator knows none (as the base class
        does)."""
        return None

    def pairs(self) -> Pairs | None:
        """The layout of the operator's changes as pairs of a retraction and an insertion
        (`txstream.engine.results.Pairs`), if it can make them so; None (the base class)."""
        return None

    def expressions(self) -> list[str]:
        """The user's SQL text in the node (to find the one a failing batch points at)."""
        return []

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        """Per input, the columns this operator clusters it by at parallelism above 1 (a join's
        key, a group-by's keys), given those its readers cluster its output by (`wanted`); None
        where it needs no clustering (as the base class)."""
        return [None] * len(self.input_schemas)

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        """Per input, the columns this operator reads of it, given the columns `needed` of its
        output: all of them (the base class; a distinct compares whole rows)."""
        return [frozenset(s.names) for s in self.input_schemas]

    def _output(self, frame: DataFrame, batch: BatchPlan) -> DataFrame:
        """The operator's output changes `frame`, consolidated where `consolidate_output` says:
        a consolidation of a join's pairs (a customer's change pairs with every order of it)
        can be most of a batch, which a group-by reading them would only repeat."""
        if not self.consolidate_output:
            return frame
        return batch.consolidated(frame, self.columns, self.readers_cluster_by)

    @abstractmethod
    def _resolve(self) -> StructType:
        """The output schema, checked against the inputs' schemas (raises on a bad definition)."""

    @abstractmethod
    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        """The output delta of one batch, given the inputs' deltas; stages state changes into
        `batch`."""


def tell_readers(ops: Sequence[Operator], outputs: Collection[int]) -> None:
    """Tell every operator what its readers need of its output, given the DAG's operators in
    order (each after its inputs) and the ids of the pipeline's output nodes: its clustering
    (`readers_cluster_by`), whether it is consolidated (`consolidate_output`) and which of its
    columns they read (`needed`: every column of an output); and what its inputs may hold
    (`many_per_key`)."""
    _tell_readers_clustering(ops)
    columns_read: dict[int, set[str]] = {}
    for op in reversed(ops):
        op.needed = (frozenset(op.columns) if op.node.id in outputs
                     else frozenset(columns_read.get(op.node.id, ())))
        for node, columns in zip(op.node.inputs, op.reads(op.needed), strict=True):
            columns_read.setdefault(node.id, set()).update(columns)
    multiplied: set[int] = set()
    for op in ops:
        op.many_per_key = any(node.id in multiplied for node in op.node.inputs)
        if op.multiplies_rows or op.many_per_key:
            multiplied.add(op.node.id)
    needed: set[int] = set(outputs)
    for op in reversed(ops):
        op.consolidate_output = op.node.id in needed
        if op.consolidate_output if op.passes_through else not op.reads_unconsolidated:
            # A padding passes its first input's rows; of the second it reads the schema only.
            read = op.node.inputs[:1] if op.passes_through else op.node.inputs
            needed.update(node.id for node in read)


def _tell_readers_clustering(ops: Sequence[Operator]) -> None:
    """Set every operator's `readers_cluster_by`: what its readers' `input_clustering` asks
    of it, the columns most readers want first."""
    wanted: dict[int, Counter[tuple[str, ...]]] = {}
    for op in reversed(ops):
        op.readers_cluster_by = tuple(
            c for c, _ in wanted.get(op.node.id, Counter()).most_common())
        best = op.readers_cluster_by[0] if op.readers_cluster_by else None
        for node, columns in zip(op.node.inputs, op.input_clustering(best), strict=True):
            if columns is not None:
                wanted.setdefault(node.id, Counter())[columns] += 1
