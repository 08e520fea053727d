"""Row-wise operators: source, select, filter, negate, concat. They keep no state; the delta
rule is the operator itself: d(f(A)) = f(dA), each row keeping its time and diff."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from txstream.changes import Changes
from txstream.changes import consolidate as consolidate_changes
from txstream.engine.batch import BatchPlan
from txstream.engine.columns import DIFF, TIME
from txstream.engine.errors import EngineInputError, PipelineDefinitionError
from txstream.engine.frames import col, union_all
from txstream.engine.hash_partitions import partition_ids, split
from txstream.engine.nodes import FilterNode, SelectNode, SourceNode
from txstream.engine.operators.base import (
    Clustered,
    Delta,
    Key,
    Operator,
    check_predicate,
    check_row_wise,
    column_names,
    first_line,
)
from txstream.engine.spark_input import SourceRows, input_rows, partitioned_rows
from txstream.engine.spark_internals import analyzed
from txstream.schemas.tables import TableSchema

# From this many rows on, a source's changes enter Spark as Arrow record batches the batch's
# task converts, columnar until then; below it, as rows converted on the driver (see
# `SourceOp.rows`): driver rows of a 500k-row batch made it a quarter slower.
ARROW_INPUT_ROWS = 50_000


class SourceOp(Operator):
    """An input table: its delta is the batch's changes of the source (see `prepared`)."""

    node: SourceNode

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def table_schema(self) -> TableSchema:
        assert self.node.schema is not None, "Pipeline.source always gives a schema"
        return self.node.schema

    def _resolve(self) -> StructType:
        return StructType.fromDDL(self.table_schema.spark_ddl())

    def key(self, inputs: Sequence[Key]) -> Key:
        return tuple(self.table_schema.primary_key) or None

    @cached_property
    def _change_types(self) -> tuple[pa.Schema, StructType]:
        """The source's changes' types in Arrow and in Spark (made once: a Spark type parsed
        from DDL is a round trip to the JVM)."""
        schema = self.table_schema
        return (schema.arrow_schema(with_changes=True),
                StructType.fromDDL(schema.spark_ddl(with_changes=True)))

    def prepared(self, changes: Changes) -> pa.Table:
        """The source's changes of a batch in the schema's types, consolidated where a reader
        needs it (`consolidate_output`: a distinct, an output): a `Changes` made with
        `Changes.of` (or cast to the schema's types here) is not known to be. A group-by or a
        join reads them as they come (a million-row batch's consolidation took 0.3 s), and a
        filter or a select before them evaluates its expressions on every row given, a row a
        transaction both inserts and deletes included (the service's sources consolidate each
        transaction: txstream.sources.pending)."""
        want = [*self.columns, TIME, DIFF]
        table = changes.table
        missing = [c for c in want if c not in table.column_names]
        if missing:
            raise EngineInputError(f"{self.node.label}: changes lack column(s) "
                                   f"{', '.join(missing)}")
        try:
            typed = table.select(want).cast(self._change_types[0])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise EngineInputError(f"{self.node.label}: changes do not fit the schema: {exc}"
                                   ) from exc
        if not self.consolidate_output:
            return typed
        return consolidate_changes(typed, self.columns).table

    def rows(self, changes: Changes, partitions: int = 1) -> SourceRows:
        """The source's changes of a batch as an RDD of rows, with no Spark job, and the
        attributes of a leaf over it (a leaf a template can rebind); from ARROW_INPUT_ROWS rows
        on, as Arrow record batches. For a batch planned in `partitions` > 1, split on the
        driver as the operators reading them cluster them (the first of `readers_cluster_by`
        whose hash is computed here, see `txstream.engine.hash_partitions`): the batch's job
        then does not exchange them for those readers."""
        table = self.prepared(changes)
        columnar = changes.num_rows >= ARROW_INPUT_ROWS
        for by in self.readers_cluster_by if partitions > 1 else ():
            ids = partition_ids(table, list(by), partitions)
            if ids is not None:
                output, rdd = partitioned_rows(self.spark, split(table, ids, partitions),
                                               self._change_types[1], columnar)
                positions = tuple(self.columns.index(c) for c in by)
                return SourceRows(output, rdd, (positions, partitions), by)
        output, rdd = input_rows(self.spark, table, self._change_types[1], columnar)
        return SourceRows(output, rdd)

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        return deltas[0]


class SelectOp(Operator):
    """New columns from row-wise expressions. A projection can map distinct rows to one row
    (an update of a column it drops), so the result is consolidated where it must be (see
    `Operator._output`); one that keeps every input column (`keep_input`: window bounds) maps
    distinct rows to distinct rows, so it passes its rows through, consolidated when its input
    is (a source's are, in Arrow, where a reader needs them so)."""

    node: SelectNode
    reads_unconsolidated = True

    @cached_property
    def _pairs(self) -> list[tuple[str, str]]:
        """(output name, expression) of every output column: with `keep_input`, the input's
        columns first."""
        pairs = list(self.node.exprs)
        if not self.node.keep_input:
            return pairs
        kept = self.input_schemas[0].names
        clash = sorted(set(kept) & {name for name, _ in pairs})
        if clash:
            raise PipelineDefinitionError(
                f"{self.node.label}: column(s) {', '.join(clash)} already in its input; rename "
                "them with select first")
        return [(name, f"`{name}`") for name in kept] + pairs

    def _exprs(self) -> list[str]:
        return [f"{expr} AS `{name}`" for name, expr in self._pairs]

    def expressions(self) -> list[str]:
        return [expr for _, expr in self._pairs]

    @cached_property
    def _plain(self) -> frozenset[str]:
        """The input's columns selected as they are."""
        return frozenset(name for name, expr in self._pairs if expr == f"`{name}`")

    def key(self, inputs: Sequence[Key]) -> Key:
        """The input's key, when every column of it is selected as it is."""
        key = inputs[0]
        return key if key is not None and set(key) <= self._plain else None

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [wanted if wanted is not None and set(wanted) <= self._plain else None]

    def _resolve(self) -> StructType:
        try:
            frame = self._empty(self.input_schemas[0]).selectExpr(*self._exprs())
        except Exception as exc:  # analysis and parse errors, as pyspark exceptions
            raise PipelineDefinitionError(f"{self.node.label}: {first_line(exc)}") from exc
        check_row_wise(self.node, frame, self.expressions(), "Project")
        self.passes_through = self.node.keep_input
        exprs = analyzed(frame).projectList()
        # Per output column, the input columns its expression reads (see `reads`).
        self._reads = {e.name(): column_names(e)
                       for e in (exprs.apply(i) for i in range(exprs.size()))}
        return frame.schema

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        return [frozenset().union(*[self._reads[c] for c in needed])]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        projected = d.selectExpr(*self._exprs(), TIME, DIFF)
        known = batch.clustering_of(d)
        if known is not None and set(known) <= self._plain:
            batch.keeps(projected, d)
        return projected if self.passes_through else self._output(projected, batch)


class FilterOp(Operator):
    node: FilterNode
    passes_through = True

    def expressions(self) -> list[str]:
        return [self.node.predicate]

    def key(self, inputs: Sequence[Key]) -> Key:
        return inputs[0]

    def _resolve(self) -> StructType:
        filtered = check_predicate(self.node, self._empty(self.input_schemas[0]),
                                   self.node.predicate)
        self._predicate_reads = column_names(analyzed(filtered).condition())
        return self.input_schemas[0]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [wanted]

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        return [needed | self._predicate_reads]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        return None if d is None else batch.keeps(d.where(self.node.predicate), d)


class NegateOp(Operator):
    passes_through = True

    def _resolve(self) -> StructType:
        return self.input_schemas[0]

    def key(self, inputs: Sequence[Key]) -> Key:
        return inputs[0]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [wanted]

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        return [needed]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        return None if d is None else batch.keeps(d.withColumn(DIFF, -col(DIFF)), d)


class ConcatOp(Operator):
    """Union all. Inputs need the same column names and types; order is the first input's."""

    reads_unconsolidated = True

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

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        present = [batch.keeps(d.select(*[col(c) for c in self.columns], col(TIME), col(DIFF)), d)
                   for d in deltas if d is not None]
        if not present:
            return None
        if len(present) == 1:
            # Its producer consolidated it only if its own readers needed that, and this
            # union's may.
            return self._output(present[0], batch)
        present = self._co_clustered(present, batch)
        return self._output(batch.keeps(union_all(present, batch.parallelism), *present), batch)

    @staticmethod
    def _co_clustered(present: list[DataFrame], batch: BatchPlan) -> list[DataFrame]:
        """Inputs clustered by different columns, one of them by some of every other's (an
        outer join: its pairs by the join key, its padded rows by a reader's key): those
        clustered otherwise are exchanged to it, so the union is clustered by it too and is
        consolidated (where a reader needs it so), and read by a group-by on more columns,
        where it is. Else the whole union would be exchanged by a reader's key, the pairs
        with it."""
        known = [batch.clustering_of(d) for d in present]
        if any(k is None for k in known):
            return present
        common = next((k for k in known if all(set(k) <= set(o) for o in known)), None)
        if common is None:
            return present
        # `clustered` leaves the inputs clustered by `common` already as they are.
        return [batch.clustered(d, list(common)) for d in present]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [wanted] * len(self.input_schemas)

    def reads(self, needed: frozenset[str]) -> list[frozenset[str]]:
        return [needed] * len(self.input_schemas)
