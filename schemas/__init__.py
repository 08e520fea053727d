"""Pydantic models that cross module boundaries: table schemas, transactions, change records."""

from schemas.changes import ChangeRecord, SourceChange
from schemas.tables import Column, ColumnType, TableSchema, TableSchemaError

__all__ = [
    "ChangeRecord",
    "Column",
    "ColumnType",
    "SourceChange",
    "TableSchema",
    "TableSchemaError",
]
