"""The incremental engine: a Table API over a DAG, compiled to Spark plans over delta
DataFrames carrying `time` and `diff`."""

from service.engine import reducers
from service.engine.engine import Engine, EngineVersion, OutputTable
from service.engine.errors import (
    EngineInputError,
    EngineStateError,
    ExpressionError,
    PipelineDefinitionError,
)
from service.engine.table import GroupedTable, Pipeline, Table

__all__ = [
    "Engine",
    "EngineInputError",
    "EngineStateError",
    "EngineVersion",
    "ExpressionError",
    "GroupedTable",
    "OutputTable",
    "Pipeline",
    "PipelineDefinitionError",
    "Table",
    "reducers",
]
