"""Pydantic models that cross module boundaries: what a user writes (the configuration) and
what crosses a process (recorded changes), validated where they enter.

    config   PipelineConfig: the pipeline's configuration file (YAML), validated at start
    sources  a Kafka source's specification and the transaction-boundary policy
    sinks    sink settings, one model per `kind`, and the Deephaven-style update record
    kafka    how every Kafka client authenticates and encrypts (`kafka_security`)
    tables   table schemas: columns, types, primary keys; their Arrow, Spark and SQL types
    changes  change records as they cross the engine's boundary in files and messages
"""

from txstream.schemas.changes import SourceChange
from txstream.schemas.tables import Column, ColumnType, TableSchema, TableSchemaError

__all__ = [
    "Column",
    "ColumnType",
    "SourceChange",
    "TableSchema",
    "TableSchemaError",
]
