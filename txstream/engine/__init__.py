"""The incremental engine: a Table API over a DAG, compiled to Spark plans over delta
DataFrames carrying `time` and `diff`."""

from txstream.engine import reducers
from txstream.engine.compiled import OutputTable
from txstream.engine.engine import Engine, EngineVersion
from txstream.engine.errors import (
    EngineInputError,
    EngineStateError,
    ExpressionError,
    InvariantError,
    PipelineDefinitionError,
)
from txstream.engine.table import GroupedTable, Pipeline, Table

__all__ = [
    "Engine",
    "EngineInputError",
    "EngineStateError",
    "EngineVersion",
    "ExpressionError",
    "GroupedTable",
    "InvariantError",
    "OutputTable",
    "Pipeline",
    "PipelineDefinitionError",
    "Table",
    "reducers",
]
