"""Table schemas: column names, types, primary keys; their Arrow, Spark and PostgreSQL types."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic_core import core_schema

from txstream.changes import CHANGE_TYPES, DIFF, TIME

# Names the engine adds to every change; user columns may not take them.
RESERVED_COLUMNS = frozenset(CHANGE_TYPES)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TableSchemaError(ValueError):
    """A table schema is malformed (unknown type, bad or duplicate column name, bad key)."""


_DECIMAL = re.compile(r"^(?:decimal|numeric)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$")
# Arrow's decimal128 and Spark's DecimalType both hold at most 38 digits.
MAX_DECIMAL_PRECISION = 38


class ColumnType:
    """A column's type: one of the named types (`ColumnType.BIGINT`, ...), or `decimal(p,s)`,
    an exact number of `p` digits, `s` of them after the point.

    Named types are singletons (compare with `is` or `==`); decimals compare by precision and
    scale. The text form (`value`, `str`) is what a schema declares: "bigint",
    "decimal(12,2)"."""

    BIGINT: ClassVar[ColumnType]
    INT: ClassVar[ColumnType]
    DOUBLE: ClassVar[ColumnType]
    TEXT: ClassVar[ColumnType]
    BOOLEAN: ClassVar[ColumnType]
    TIMESTAMP: ClassVar[ColumnType]
    DATE: ClassVar[ColumnType]

    __slots__ = ("_arrow", "_postgres", "_spark", "precision", "scale", "value")

    def __init__(self, value: str, arrow: pa.DataType, spark: str, postgres: str,
                 precision: int | None = None, scale: int | None = None) -> None:
        self.value = value
        self._arrow = arrow
        self._spark = spark
        self._postgres = postgres
        self.precision = precision
        self.scale = scale

    @classmethod
    def decimal(cls, precision: int, scale: int = 0) -> ColumnType:
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise TableSchemaError(
                f"decimal({precision},{scale}): precision must be 1 to {MAX_DECIMAL_PRECISION}")
        if not 0 <= scale <= precision:
            raise TableSchemaError(
                f"decimal({precision},{scale}): scale must be 0 to the precision")
        ddl = f"DECIMAL({precision},{scale})"
        return cls(f"decimal({precision},{scale})", pa.decimal128(precision, scale), ddl,
                   f"NUMERIC({precision},{scale})", precision, scale)

    @property
    def is_decimal(self) -> bool:
        return self.precision is not None

    @property
    def arrow(self) -> pa.DataType:
        return self._arrow

    @property
    def spark_ddl(self) -> str:
        return self._spark

    @property
    def postgres(self) -> str:
        return self._postgres

    @property
    def is_numeric(self) -> bool:
        return self.is_decimal or self in (ColumnType.BIGINT, ColumnType.INT, ColumnType.DOUBLE)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnType) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"ColumnType({self.value!r})"

    @classmethod
    def named(cls) -> list[ColumnType]:
        return list(_NAMED.values())

    @classmethod
    def parse(cls, name: str) -> ColumnType:
        key = name.strip().lower()
        found = _ALIASES.get(key)
        if found is not None:
            return found
        decimal = _DECIMAL.match(key)
        if decimal is not None:
            return cls.decimal(int(decimal.group(1)), int(decimal.group(2) or 0))
        known = ", ".join(sorted(_ALIASES))
        raise TableSchemaError(
            f"unknown column type {name!r}; known types: {known}, decimal(p,s)")

    @classmethod
    def from_spark(cls, simple_string: str) -> ColumnType:
        """The column type of a Spark `DataType.simpleString()`."""
        found = _FROM_SPARK.get(simple_string)
        if found is None and simple_string.startswith("decimal("):
            return cls.parse(simple_string)
        if found is None:
            raise TableSchemaError(
                f"Spark type {simple_string!r} has no txstream column type; cast it to one of "
                f"{', '.join(t.value for t in cls.named())} or decimal(p,s)"
            )
        return found

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        def validate(value: Any) -> ColumnType:
            return value if isinstance(value, ColumnType) else cls.parse(str(value))

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.to_string_ser_schema())


_NAMED = {
    t.value: t for t in (
        ColumnType("bigint", pa.int64(), "BIGINT", "BIGINT"),
        ColumnType("int", pa.int32(), "INT", "INTEGER"),
        ColumnType("double", pa.float64(), "DOUBLE", "DOUBLE PRECISION"),
        ColumnType("text", pa.string(), "STRING", "TEXT"),
        ColumnType("boolean", pa.bool_(), "BOOLEAN", "BOOLEAN"),
        ColumnType("timestamp", pa.timestamp("us", tz="UTC"), "TIMESTAMP", "TIMESTAMPTZ"),
        ColumnType("date", pa.date32(), "DATE", "DATE"),
    )
}
ColumnType.BIGINT = _NAMED["bigint"]
ColumnType.INT = _NAMED["int"]
ColumnType.DOUBLE = _NAMED["double"]
ColumnType.TEXT = _NAMED["text"]
ColumnType.BOOLEAN = _NAMED["boolean"]
ColumnType.TIMESTAMP = _NAMED["timestamp"]
ColumnType.DATE = _NAMED["date"]

_ALIASES = _NAMED | {
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

    # An identifier (letters, digits, underscore), not `time` or `diff`.
    name: str
    # The type of the column's values (in PostgreSQL, Arrow and Spark: their nearest type).
    type: ColumnType
    # Primary key columns are never nullable, whatever this says.
    nullable: bool = True


class TableSchema(BaseModel):
    """The columns of a table, in order, and its primary key (possibly empty)."""

    model_config = ConfigDict(frozen=True)

    # The columns, in order.
    columns: tuple[Column, ...]
    # Column names; empty: the table has no key.
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
            fields += [pa.field(n, t, nullable=False) for n, t in CHANGE_TYPES.items()]
        return pa.schema(fields)

    def spark_ddl(self, with_changes: bool = False) -> str:
        cols = [f"`{c.name}` {c.type.spark_ddl}" for c in self.columns]
        if with_changes:
            cols += [f"`{TIME}` BIGINT", f"`{DIFF}` BIGINT"]
        return ", ".join(cols)
