"""txstream: a transactional change-stream service.

A pipeline is written against this module alone::

    from txstream import Pipeline, TableSchema, reducers as r, temporal as t

The names below are imported on first use (PEP 562), so a subscriber that only imports
`txstream.client` or `txstream.updates` does not load Spark. The code map of the subpackages
is in the README ("Code map").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txstream.engine import reducers, temporal
    from txstream.engine.errors import PipelineDefinitionError
    from txstream.engine.table import GroupedTable, Pipeline, Table
    from txstream.schemas.tables import TableSchema

__all__ = ["GroupedTable", "Pipeline", "PipelineDefinitionError", "Table", "TableSchema",
           "reducers", "temporal"]

_HOMES = {"GroupedTable": "txstream.engine.table", "Pipeline": "txstream.engine.table",
          "Table": "txstream.engine.table", "PipelineDefinitionError": "txstream.engine.errors",
          "TableSchema": "txstream.schemas.tables"}


def __getattr__(name: str) -> Any:
    if name in ("reducers", "temporal"):
        return importlib.import_module(f"txstream.engine.{name}")
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'txstream' has no attribute {name!r}")
