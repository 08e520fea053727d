"""A pipeline compiled into incremental operators, once: what the engine runs each batch
through, and what it asks of the DAG.

The rule: compiling checks the whole definition and runs no Spark job. Every operator resolves
its output schema against its inputs' (`PipelineDefinitionError` names the table and the
column, before any data flows), makes its states where the engine's `StatePlacement` says,
and is told once what its readers need of its output (`tell_readers`): its clustering, whether
it is consolidated, which columns are read, and whether it emits pairs (an output's only
reader, `txstream.engine.results`). Operators are numbered in DAG order, which is stable for one
pipeline definition: so are the states' names (a directory each in a saved state) and the
fingerprint a saved state must match (`txstream.engine.persistence`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.nodes import Node
from txstream.engine.operators import OPERATORS, Operator, SourceOp
from txstream.engine.operators.base import Key, tell_readers
from txstream.engine.operators.late import LateOp
from txstream.engine.results import ResultLayout
from txstream.engine.state import StatePlacement, ZSetState
from txstream.engine.table import Pipeline
from txstream.schemas.tables import Column, ColumnType, TableSchema


@dataclass(frozen=True)
class OutputTable:
    name: str
    schema: TableSchema
    node: Node


def _table_schema(name: str, schema: StructType, key: tuple[str, ...] | None, inferred: Key
                  ) -> TableSchema:
    """An output's schema: its columns, and its primary key (`key`, else the one the DAG
    shows, else none)."""
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


class CompiledPipeline:
    """`pipeline`'s operators, in DAG order (each after its inputs), with their states in
    `placement`; its outputs and sources by name, and the layout of a batch's result."""

    def __init__(self, pipeline: Pipeline, spark: SparkSession, placement: StatePlacement
                 ) -> None:
        if not pipeline.outputs:
            raise PipelineDefinitionError("the pipeline has no outputs: call pipeline.output(...)")
        self.operators: list[Operator] = []
        by_id: dict[int, Operator] = {}
        keys: dict[int, Key] = {}  # a set of unique columns of each node, where one is known
        for node in pipeline.nodes():
            op_type = OPERATORS[type(node)]
            op = op_type(spark, node, [by_id[i.id].schema for i in node.inputs], placement)
            by_id[node.id] = op
            keys[node.id] = op.key([keys[i.id] for i in node.inputs])
            self.operators.append(op)
        # Every batch's late rows, counted by the engine whether or not an output shows them:
        # outputs of the engine's own, by a name no user's output can have.
        self.late = {f"__late{i}": op.node for i, op in enumerate(
            op for op in self.operators if isinstance(op, LateOp))}
        nodes = [*(out.node for out in pipeline.outputs.values()), *self.late.values()]
        tell_readers(self.operators, {node.id for node in nodes})
        # A delta read by several operators or outputs is computed once (BatchPlan.shared).
        self.consumers = Counter(i.id for op in self.operators for i in op.node.inputs)
        self.consumers.update(node.id for node in nodes)
        outputs = {node.id for node in nodes}
        for op in self.operators:  # read by an output alone: as pairs, if it makes them
            op.emit_pairs = (op.pairs() is not None and op.node.id in outputs
                             and self.consumers[op.node.id] == 1)
        self.outputs = {
            name: OutputTable(name, _table_schema(name, by_id[out.node.id].schema,
                                                  out.primary_key, keys[out.node.id]), out.node)
            for name, out in pipeline.outputs.items()
        }
        self.sources = {op.name: op for op in self.operators if isinstance(op, SourceOp)}
        # Whether computing a batch as its net change gives the same outputs at its end (see
        # `Operator.sees_transactions`).
        self.nets_exactly = not any(op.sees_transactions for op in self.operators)
        late = {name: (_table_schema(name, by_id[node.id].schema, (), None), None)
                for name, node in self.late.items()}
        self.result = ResultLayout({**{name: (out.schema, by_id[out.node.id].pairs() if
                                              by_id[out.node.id].emit_pairs else None)
                                       for name, out in self.outputs.items()}, **late})
        # Every operator's states by a name stable for the pipeline definition (DAG order).
        self.states: dict[str, ZSetState] = {
            f"{i:03d}-{type(op).__name__}-{name}": state
            for i, op in enumerate(self.operators) for name, state in op.states().items()}

    def fingerprint(self) -> list[str]:
        """What a saved state must match: each operator's output schema and states' layout."""
        return [f"{op.node.label} -> {op.schema.simpleString()} {op.state_layout()}".rstrip()
                for op in self.operators]
