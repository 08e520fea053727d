"""Row-wise operators: source, select, filter, negate, concat. They keep no state; the delta
rule is the operator itself: d(f(A)) = f(dA), each row keeping its time and diff."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.types import StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import DIFF, TIME
from txstream.engine.consolidation import consolidate
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import col, union_all
from txstream.engine.operators.base import Delta, Operator, check_row_wise, first_line
from txstream.engine.table import FilterNode, SelectNode, SourceNode


class SourceOp(Operator):
    """An input table: its delta is the batch's changes of the source, consolidated on entry."""

    def _resolve(self) -> StructType:
        assert isinstance(self.node, SourceNode) and self.node.schema is not None
        return StructType.fromDDL(self.node.schema.spark_ddl())

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        return deltas[0]


class SelectOp(Operator):
    """New columns from row-wise expressions. A projection can map distinct rows to one row
    (an update of a column it drops), so the result is consolidated."""

    node: SelectNode

    def _exprs(self) -> list[str]:
        return [f"{expr} AS `{name}`" for name, expr in self.node.exprs]

    def _resolve(self) -> StructType:
        try:
            frame = self._empty(self.input_schemas[0]).selectExpr(*self._exprs())
        except Exception as exc:  # analysis and parse errors, as pyspark exceptions
            raise PipelineDefinitionError(f"{self.node.label}: {first_line(exc)}") from exc
        check_row_wise(self.node, frame, [e for _, e in self.node.exprs], "Project")
        return frame.schema

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        return consolidate(d.selectExpr(*self._exprs(), TIME, DIFF), self.columns)


class FilterOp(Operator):
    node: FilterNode

    def _resolve(self) -> StructType:
        empty = self._empty(self.input_schemas[0])
        try:
            typed = empty.selectExpr(f"({self.node.predicate}) AS p").schema["p"].dataType
            filtered = empty.where(self.node.predicate)
        except Exception as exc:
            raise PipelineDefinitionError(f"{self.node.label}: {first_line(exc)}") from exc
        check_row_wise(self.node, filtered, [self.node.predicate], "Filter")
        if typed.simpleString() != "boolean":
            raise PipelineDefinitionError(
                f"{self.node.label}: the predicate is {typed.simpleString()}, not boolean"
            )
        return self.input_schemas[0]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        return None if d is None else d.where(self.node.predicate)


class NegateOp(Operator):
    def _resolve(self) -> StructType:
        return self.input_schemas[0]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
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

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        present = [d.select(*[col(c) for c in self.columns], col(TIME), col(DIFF))
                   for d in deltas if d is not None]
        if not present:
            return None
        if len(present) == 1:
            return present[0]
        return consolidate(union_all(present), self.columns)
