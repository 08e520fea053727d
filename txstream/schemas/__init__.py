"""Pydantic models that cross module boundaries: table schemas, transactions, change records."""

from txstream.schemas.changes import ChangeRecord, SourceChange
from txstream.schemas.tables import Column, ColumnType, TableSchema, TableSchemaError

__all__ = [
    "ChangeRecord",
    "Column",
    "ColumnType",
    "SourceChange",
    "TableSchema",
    "TableSchemaError",
]
