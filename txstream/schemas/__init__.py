"""Pydantic models that cross module boundaries: table schemas, source settings, sink settings,
Kafka security, the pipeline configuration, recorded input changes."""

from txstream.schemas.changes import SourceChange
from txstream.schemas.tables import Column, ColumnType, TableSchema, TableSchemaError

__all__ = [
    "Column",
    "ColumnType",
    "SourceChange",
    "TableSchema",
    "TableSchemaError",
]
