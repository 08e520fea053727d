"""Table schemas: column names, types, primary keys; their Arrow, Spark and PostgreSQL types."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

# Names the engine adds to every change; user columns may not take them.
RESERVED_COLUMNS = frozenset({"time", "diff"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TableSchemaError(ValueError):
    """A table schema is malformed (unknown type, bad or duplicate column name, bad key)."""


class ColumnType(StrEnum):
    BIGINT = "bigint"
    INT = "int"
    DOUBLE = "double"
    TEXT = "text"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"
    DATE = "date"

    @property
    def arrow(self) -> pa.DataType:
        return _ARROW[self]

    @property
    def spark_ddl(self) -> str:
        return _SPARK_DDL[self]

    @property
    def postgres(self) -> str:
        return _POSTGRES[self]

    @property
    def is_numeric(self) -> bool:
        return self in (ColumnType.BIGINT, ColumnType.INT, ColumnType.DOUBLE)

    @classmethod
    def parse(cls, name: str) -> ColumnType:
        key = name.strip().lower()
        found = _ALIASES.get(key)
        if found is None:
            known = ", ".join(sorted(_ALIASES))
            raise TableSchemaError(f"unknown column type {name!r}; known types: {known}")
        return found

    @classmethod
    def from_spark(cls, simple_string: str) -> ColumnType:
        """The column type of a Spark `DataType.simpleString()`."""
        found = _FROM_SPARK.get(simple_string)
        if found is None:
            raise TableSchemaError(
                f"Spark type {simple_string!r} has no txstream column type; cast it to one of "
                f"{', '.join(t.value for t in cls)}"
            )
        return found


_ARROW: dict[ColumnType, pa.DataType] = {
    ColumnType.BIGINT: pa.int64(),
    ColumnType.INT: pa.int32(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.TEXT: pa.string(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    ColumnType.DATE: pa.date32(),
}
_SPARK_DDL = {
    ColumnType.BIGINT: "BIGINT",
    ColumnType.INT: "INT",
    ColumnType.DOUBLE: "DOUBLE",
    ColumnType.TEXT: "STRING",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.TIMESTAMP: "TIMESTAMP",
    ColumnType.DATE: "DATE",
}
_POSTGRES = {
    ColumnType.BIGINT: "BIGINT",
    ColumnType.INT: "INTEGER",
    ColumnType.DOUBLE: "DOUBLE PRECISION",
    ColumnType.TEXT: "TEXT",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.TIMESTAMP: "TIMESTAMPTZ",
    ColumnType.DATE: "DATE",
}
_ALIASES = {t.value: t for t in ColumnType} | {
    "long": ColumnType.BIGINT,
    "int64": ColumnType.BIGINT,
    "integer": ColumnType.INT,
    "int32": ColumnType.INT,
    "float": ColumnType.DOUBLE,
    "float64": ColumnType.DOUBLE,
    "string": ColumnType.TEXT,
    "str": ColumnType.TEXT,
    "bool": ColumnType.BOOLEAN,
}
_FROM_SPARK = {
    "bigint": ColumnType.BIGINT,
    "int": ColumnType.INT,
    "double": ColumnType.DOUBLE,
    "string": ColumnType.TEXT,
    "boolean": ColumnType.BOOLEAN,
    "timestamp": ColumnType.TIMESTAMP,
    "date": ColumnType.DATE,
    # Spark widens some expressions to these; they are stored as the nearest type.
    "float": ColumnType.DOUBLE,
    "smallint": ColumnType.INT,
    "tinyint": ColumnType.INT,
    "void": ColumnType.TEXT,
}


class Column(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    type: ColumnType
    nullable: bool = True

    @model_validator(mode="before")
    @classmethod
    def _parse_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("type"), str):
            data = {**data, "type": ColumnType.parse(data["type"])}
        return data


class TableSchema(BaseModel):
    """The columns of a table, in order, and its primary key (possibly empty)."""

    model_config = ConfigDict(frozen=True)

    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = Field(default=())

    @model_validator(mode="after")
    def _check(self) -> TableSchema:
        names = [c.name for c in self.columns]
        if not names:
            raise TableSchemaError("a table needs at least one column")
        for name in names:
            if not _IDENTIFIER.match(name):
                raise TableSchemaError(
                    f"column name {name!r} is not an identifier (letters, digits, underscore)"
                )
            if name.lower() in RESERVED_COLUMNS:
                raise TableSchemaError(f"column name {name!r} is reserved for change metadata")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TableSchemaError(f"duplicate column names: {', '.join(dupes)}")
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise TableSchemaError(f"primary key column(s) not in the table: {', '.join(missing)}")
        return self

    @classmethod
    def of(cls, columns: dict[str, str | ColumnType], primary_key: tuple[str, ...] | list[str] = ()
           ) -> TableSchema:
        """Shorthand: `TableSchema.of({"id": "bigint", "name": "text"}, primary_key=["id"])`.

        Primary key columns are not nullable.
        """
        pk = tuple(primary_key)
        cols = tuple(
            Column(name=n, type=t if isinstance(t, ColumnType) else ColumnType.parse(t),
                   nullable=n not in pk)
            for n, t in columns.items()
        )
        return cls(columns=cols, primary_key=pk)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def arrow_schema(self, with_changes: bool = False) -> pa.Schema:
        fields = [pa.field(c.name, c.type.arrow, nullable=c.nullable) for c in self.columns]
        if with_changes:
            fields += [pa.field("time", pa.int64(), False), pa.field("diff", pa.int64(), False)]
        return pa.schema(fields)

    def spark_ddl(self, with_changes: bool = False) -> str:
        cols = [f"`{c.name}` {c.type.spark_ddl}" for c in self.columns]
        if with_changes:
            cols += ["`time` BIGINT", "`diff` BIGINT"]
        return ", ".join(cols)
