"""The incremental engine: a Table API over a DAG, compiled to Spark plans over delta
DataFrames carrying `time` and `diff`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txstream.engine.errors import (
    EngineInputError,
    EngineStateError,
    ExpressionError,
    InvariantError,
    PipelineDefinitionError,
)

if TYPE_CHECKING:
    from txstream.engine import reducers
    from txstream.engine.engine import Engine, EngineVersion, OutputTable
    from txstream.engine.table import GroupedTable, Pipeline, Table

# Imported on first use, not with the package: they load Spark, which a module that needs only
# the engine's errors (the service's runner) must not.
_LAZY = {"Engine": "engine", "EngineVersion": "engine", "OutputTable": "engine",
         "GroupedTable": "table", "Pipeline": "table", "Table": "table", "reducers": None}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'txstream.engine' has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        return importlib.import_module(f"txstream.engine.{name}")
    return getattr(importlib.import_module(f"txstream.engine.{module}"), name)

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
