"""The engine: compiles a pipeline once into incremental operators, then turns batches of input
changes (many consecutive transactions at once) into the output tables' changes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from schemas.tables import Column, ColumnType, TableSchema
from service.engine.errors import EngineInputError, EngineStateError, PipelineDefinitionError
from service.engine.frames import DIFF, TIME, consolidate
from service.engine.operators import OPERATORS, Operator, SourceOp
from service.engine.state import ZSetState
from service.engine.table import (
    DistinctNode,
    FilterNode,
    JoinNode,
    NegateNode,
    Node,
    Pipeline,
    ReduceNode,
    SelectNode,
    SourceNode,
)


@dataclass(frozen=True)
class OutputTable:
    name: str
    schema: TableSchema
    node: Node


class Engine:
    """Runs one pipeline. Not thread-safe: one batch at a time, in transaction order."""

    def __init__(self, pipeline: Pipeline, spark: SparkSession) -> None:
        if not pipeline.outputs:
            raise PipelineDefinitionError("the pipeline has no outputs: call pipeline.output(...)")
        self.spark = spark
        self.pipeline = pipeline
        self._ops: list[Operator] = []
        by_id: dict[int, Operator] = {}
        for node in pipeline.nodes():
            op_type = OPERATORS[type(node)]
            op = op_type(spark, node, [by_id[i.id].schema for i in node.inputs])
            by_id[node.id] = op
            self._ops.append(op)
        self._by_id = by_id
        self._consumers = Counter(i.id for op in self._ops for i in op.node.inputs)
        self.outputs = {
            name: OutputTable(name, self._table_schema(name, by_id[out.node.id].schema,
                                                       out.primary_key, out.node), out.node)
            for name, out in pipeline.outputs.items()
        }
        self.sources = {
            op.node.name: op for op in self._ops
            if isinstance(op, SourceOp) and isinstance(op.node, SourceNode)
        }

    def _table_schema(self, name: str, schema: StructType, key: tuple[str, ...] | None,
                      node: Node) -> TableSchema:
        inferred = self._key_of(node)
        primary_key = key if key is not None else (inferred or ())
        missing = [k for k in primary_key if k not in schema.names]
        if missing:
            raise PipelineDefinitionError(
                f"output {name!r}: primary key column(s) {', '.join(missing)} not in "
                f"{', '.join(schema.names)}"
            )
        # Every column may hold nulls, keys too: a group-by key or a distinct row can be null.
        return TableSchema(
            columns=tuple(
                Column(name=f.name, type=ColumnType.from_spark(f.dataType.simpleString()))
                for f in schema.fields
            ),
            primary_key=tuple(primary_key),
        )

    def _key_of(self, node: Node) -> tuple[str, ...] | None:
        """A set of columns that is unique in the table, when the DAG shows one."""
        if isinstance(node, SourceNode):
            return (node.schema.primary_key or None) if node.schema else None
        if isinstance(node, FilterNode | NegateNode):
            return self._key_of(node.inputs[0])
        if isinstance(node, SelectNode):
            key = self._key_of(node.inputs[0])
            plain = {name for name, expr in node.exprs if expr == f"`{name}`"}
            return key if key is not None and set(key) <= plain else None
        if isinstance(node, JoinNode):
            left, right = (self._key_of(i) for i in node.inputs)
            on = set(node.on)
            if left is not None and right is not None and set(right) <= on:
                return left
            if left is not None and right is not None and set(left) <= on:
                return right
            if left is not None and right is not None:
                return tuple(dict.fromkeys(left + right))
            return None
        if isinstance(node, DistinctNode):
            return tuple(self._by_id[node.id].schema.names)
        if isinstance(node, ReduceNode):
            return node.keys
        return None

    def _to_spark(self, op: SourceOp, changes: pa.Table) -> DataFrame:
        name = op.node.label
        want = [*op.columns, TIME, DIFF]
        missing = [c for c in want if c not in changes.column_names]
        if missing:
            raise EngineInputError(f"{name}: changes lack column(s) {', '.join(missing)}")
        assert isinstance(op.node, SourceNode) and op.node.schema is not None
        arrow_schema = op.node.schema.arrow_schema(with_changes=True)
        try:
            typed = changes.select(want).cast(arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise EngineInputError(f"{name}: changes do not fit the schema: {exc}") from exc
        spark_schema = StructType.fromDDL(op.node.schema.spark_ddl(with_changes=True))
        return self.spark.createDataFrame(typed, schema=spark_schema)

    def process(self, changes: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
        """Run one batch: `changes` maps source names to their columns plus `time` and `diff`
        (any number of consecutive transactions, all later than those already processed).
        Returns every output's consolidated changes, sorted by time, and within a time the
        deletions (-1) before the insertions (+1)."""
        unknown = sorted(set(changes) - set(self.sources))
        if unknown:
            raise EngineInputError(
                f"unknown source(s) {', '.join(unknown)}; the pipeline has "
                f"{', '.join(sorted(self.sources))}"
            )
        deltas: dict[int, DataFrame | None] = {}
        batch_rows = sum(t.num_rows for t in changes.values())
        for op in self._ops:
            op.batch_rows = batch_rows
            if isinstance(op, SourceOp):
                table = changes.get(op.node.name)  # type: ignore[attr-defined]
                delta = None
                if table is not None and table.num_rows:
                    delta = consolidate(self._to_spark(op, table), op.columns)
            else:
                delta = op.step([deltas[i.id] for i in op.node.inputs])
            if delta is not None and self._consumers[op.node.id] > 1:
                # Computed once by the first job that needs it; consumers see a leaf plan.
                delta = delta.localCheckpoint(eager=False)
            deltas[op.node.id] = delta
        return {name: self._collect(out, deltas[out.node.id])
                for name, out in self.outputs.items()}

    def _fingerprint(self) -> list[str]:
        """What a saved state must match: every operator, in order, with its output schema."""
        return [f"{op.node.label} -> {op.schema.simpleString()}" for op in self._ops]

    def _states(self) -> dict[str, ZSetState]:
        # Operators are numbered in DAG order, which is stable for one pipeline definition.
        return {f"{i:03d}-{type(op).__name__}-{name}": state
                for i, op in enumerate(self._ops) for name, state in op.states().items()}

    def save_state(self, path: str) -> None:
        """Write every operator's state under `path`, a new directory (local or any
        Hadoop-compatible URI). The manifest is written last: a state without it is incomplete.
        """
        saved = []
        for name, state in self._states().items():
            if not state.is_empty:
                state.save(f"{path}/{name}")
                saved.append(name)
        manifest = json.dumps({"format": 1, "operators": self._fingerprint(), "states": saved})
        self.spark.createDataFrame([(manifest,)], "manifest STRING").coalesce(1) \
            .write.text(f"{path}/_manifest")

    def load_state(self, path: str) -> None:
        """Replace the engine's state with the one `save_state` wrote at `path`."""
        try:
            text = self.spark.read.text(f"{path}/_manifest").first()
        except AnalysisException as exc:
            raise EngineStateError(f"no complete engine state at {path}: {exc}") from exc
        if text is None:
            raise EngineStateError(f"no complete engine state at {path}: empty manifest")
        manifest = json.loads(text[0])
        mine = self._fingerprint()
        if manifest.get("operators") != mine:
            theirs = manifest.get("operators", [])
            diff = next((f"{a!r} vs now {b!r}" for a, b in zip(theirs, mine, strict=False)
                         if a != b), f"{len(theirs)} operators vs now {len(mine)}")
            raise EngineStateError(
                f"the state at {path} was saved by a different pipeline definition "
                f"(first difference: {diff}); start from empty state instead"
            )
        saved = set(manifest.get("states", []))
        for name, state in self._states().items():
            state.load(self.spark, f"{path}/{name}" if name in saved else None)

    @staticmethod
    def _collect(out: OutputTable, delta: DataFrame | None) -> pa.Table:
        schema = out.schema.arrow_schema(with_changes=True)
        if delta is None:
            return schema.empty_table()
        table = delta.select(*[f"`{c}`" for c in out.schema.names], TIME, DIFF).toArrow()
        return table.cast(schema).sort_by([(TIME, "ascending"), (DIFF, "ascending")])
