"""Kafka source specifications and transaction-boundary policy: what the Kafka input side reads,
how it decodes it and how it groups records into numbered transactions."""

from __future__ import annotations

import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    create_model,
    field_validator,
    model_validator,
)

from txstream.schemas.tables import ColumnType, TableSchema


class SourceSpecError(ValueError):
    """A source specification is inconsistent (bad path, metadata column type, semantics...)."""


class KafkaMetadata(StrEnum):
    """Parts of a Kafka message that can be exposed as a column instead of read from the value."""

    KEY = "key"
    HEADERS = "headers"
    TOPIC = "topic"
    PARTITION = "partition"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"


# Column types a metadata column may be declared with.
METADATA_TYPES: dict[KafkaMetadata, frozenset[ColumnType]] = {
    KafkaMetadata.KEY: frozenset({ColumnType.TEXT}),
    KafkaMetadata.HEADERS: frozenset({ColumnType.TEXT}),
    KafkaMetadata.TOPIC: frozenset({ColumnType.TEXT}),
    KafkaMetadata.PARTITION: frozenset({ColumnType.INT, ColumnType.BIGINT}),
    KafkaMetadata.OFFSET: frozenset({ColumnType.BIGINT}),
    KafkaMetadata.TIMESTAMP: frozenset({ColumnType.TIMESTAMP}),
}


_INT32 = Field(ge=-(2**31), le=2**31 - 1)
_INT64 = Field(ge=-(2**63), le=2**63 - 1)
# JSON value types per column type: strict, as Arrow's JSON reader is (no "1" for 1, no 1 for
# true), except timestamps and dates, which JSON can only carry as ISO text.
_JSON_TYPES: dict[ColumnType, Any] = {
    ColumnType.BIGINT: Annotated[int, Strict(), _INT64],
    ColumnType.INT: Annotated[int, Strict(), _INT32],
    ColumnType.DOUBLE: Annotated[float, Strict()],
    ColumnType.TEXT: Annotated[str, Strict()],
    ColumnType.BOOLEAN: Annotated[bool, Strict()],
    ColumnType.TIMESTAMP: datetime.datetime,
    ColumnType.DATE: datetime.date,
}


def _json_decimal(ctype: ColumnType) -> Any:
    """A decimal column takes a JSON number or a numeric string, with at most its digits."""
    assert ctype.precision is not None and ctype.scale is not None
    return Annotated[Decimal, Field(max_digits=ctype.precision, decimal_places=ctype.scale,
                                    allow_inf_nan=False)]


def row_model(schema: TableSchema, columns: list[str], name: str = "Row") -> type[BaseModel]:
    """A pydantic model of one JSON row of `columns` of `schema` (non-nullable columns are
    required). The batch decoder validates with Arrow; this model explains a rejected record."""
    fields: dict[str, Any] = {}
    for i, col in enumerate(columns):
        column = schema.column(col)
        json_type = _JSON_TYPES.get(column.type) or _json_decimal(column.type)
        # Positional names with the column as alias: a column may be called like a BaseModel
        # attribute ("json", "copy").
        fields[f"c{i}"] = (
            (json_type, Field(alias=col)) if not column.nullable
            else (json_type | None, Field(default=None, alias=col))
        )
    return create_model(name, **fields)


def split_path(path: str) -> tuple[str, ...]:
    """`"a.b.c"` -> `("a", "b", "c")`; empty segments are a user error."""
    parts = tuple(path.split("."))
    if not path or any(not p for p in parts):
        raise SourceSpecError(f"field path {path!r} is not a dotted path like 'order.customer.id'")
    return parts


# Debezium connectors whose transaction ids txstream knows (`txstream.sources.debezium.ids`).
DebeziumConnector = Literal["postgresql", "mysql", "mariadb", "sqlserver", "oracle", "mongodb",
                            "db2"]
# Debezium's default `unavailable.value.placeholder`.
UNAVAILABLE_VALUE = "__debezium_unavailable_value"


class RecordField(BaseModel):
    """A value found either in the message value (dotted JSON path) or in a message header."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # A dotted path in the JSON value, e.g. `transaction.id`.
    field: str | None = None
    # The name of a message header.
    header: str | None = None

    @model_validator(mode="after")
    def _one_place(self) -> RecordField:
        if (self.field is None) == (self.header is None):
            raise SourceSpecError("give exactly one of 'field' (a dotted JSON path) or 'header'")
        if self.field is not None:
            split_path(self.field)
        return self


class UpstreamTransactions(BaseModel):
    """Where records carry their upstream transaction id and, optionally, how the upstream
    tells that a transaction is complete.

    - `count`: the number of records of the transaction across every partition and topic of
      the pipeline's sources; it closes once that many were read (valid or not).
    - `end`: a marker (boolean field, or header "true"/"1") on the transaction's last record;
      it closes once the marker was read.
    - `metadata_topic` (Debezium's transaction metadata, `<topic.prefix>.transaction`): the
      transaction's `END` event there announces its record count per table
      (`data_collections`); it closes once the announced records of every table of the
      pipeline were read. `data_collection` is this source's table as Debezium names it there
      (`schema.table` for PostgreSQL, `database.table` for MySQL); the id defaults to the
      change events' `transaction.id`.
    - none of these: it closes when every partition it was seen on has moved on to another id
      or reached its end (needs `isolation.level=read_committed`).
    See `txstream.sources.transactions` for the limits of each rule.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Where each record's transaction id is (Debezium's `transaction.id` by default with
    # `metadata_topic`).
    id: RecordField
    # JSON type of an id read from a field (header ids are always read as UTF-8 text).
    id_type: Literal["text", "bigint"] = "text"
    count: RecordField | None = None
    end: RecordField | None = None
    metadata_topic: str | None = None
    data_collection: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _debezium_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("metadata_topic") and "id" not in data:
            return {**data, "id": RecordField(field="transaction.id")}
        return data

    @model_validator(mode="after")
    def _one_rule(self) -> UpstreamTransactions:
        rules = [name for name in ("count", "end", "metadata_topic")
                 if getattr(self, name) is not None]
        if len(rules) > 1:
            raise SourceSpecError(f"give one of 'count', 'end' or 'metadata_topic' for upstream "
                                  f"transactions, not {' and '.join(rules)}")
        if (self.metadata_topic is None) != (self.data_collection is None):
            raise SourceSpecError(
                "'metadata_topic' and 'data_collection' go together: the topic of Debezium's "
                "transaction events and this source's table as they name it (e.g. "
                "'public.orders')")
        return self

    @property
    def needs_end(self) -> bool:
        """A transaction stays open until its end marker or its END event was read."""
        return self.end is not None or self.metadata_topic is not None


class SourceSpec(BaseModel):
    """One Kafka topic read as one input table.

    JSON values per column type: bigint/int integers (in range), double numbers, text strings,
    boolean true/false, timestamp ISO-8601 text (UTC when no offset), date YYYY-MM-DD text,
    decimal(p,s) numbers or numeric strings with at most `p` digits, `s` after the point (read
    from their JSON text, never through a float). Debezium sources encode decimals as their
    connector's `decimal.handling.mode` says: `decimal_handling_mode`. Debezium's numeric
    temporal encodings (days / micros since the epoch) are not decoded: give the connector ISO
    string converters, or declare such columns bigint. A Debezium source matches transaction
    ids by their connector's shape (`connector`, `txstream.sources.debezium.ids`), skips
    tombstones that change nothing, and reads the connector's placeholder for an unchanged
    TOAST value (`unavailable_value_placeholder`) as the previous value
    (`txstream.sources.debezium.rows`). A truncate (`op: t`) deletes every row of an upsert
    source in its transaction (`txstream.sources.upsert`; dead-lettered on insert_delete);
    heartbeats, schema changes and logical decoding messages (`op: m`) are skipped, neither
    dead-lettered nor in a transaction (`txstream.sources.debezium.events`); snapshot reads
    (`op: r`) form mini-batches. `debezium_flattened` reads the rows of Debezium's
    ExtractNewRecordState SMT, upsert only: `__deleted: "true"` or `__op: "d"` deletes the
    key, and tombstones, placeholders, decimals and heartbeats are read as for `debezium`.
    `value_format` `avro`, `json_schema` or `protobuf` reads each value in Confluent's wire
    format with its writer schema from `schema_registry_url`, then as the JSON form of the
    record (docs/guide.md, "Schema Registry").
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # The input table's name, as the pipeline's `p.source(name, schema)` gives it.
    name: str
    # The Kafka topic read.
    topic: str
    # The table this source feeds: its columns and primary key. Written `schema` in the file;
    # the field's own name differs because `schema` shadows a BaseModel attribute.
    table_schema: TableSchema = Field(alias="schema")
    # `debezium`: the connector's change events; `debezium_flattened`: the same after Debezium's
    # ExtractNewRecordState SMT (the row itself, `__deleted` for deletes), upsert only.
    format: Literal["json", "debezium", "debezium_flattened"] = "json"
    # How each value is serialized: `avro`, `json_schema` and `protobuf` are Confluent's wire
    # format (magic byte 0, 4-byte big-endian schema id, then Avro binary, the JSON document, or
    # Protobuf's message indexes and message), the writer schema read by id from
    # `schema_registry_url`; the decoded record is read as `format` reads a JSON value
    # (`txstream.sources.registry.framed`). Credentials come from the environment
    # (`txstream.sources.registry.client`).
    value_format: Literal["json", "avro", "json_schema", "protobuf"] = "json"
    schema_registry_url: str | None = Field(default=None, pattern=r"^https?://")
    # What a record means: `append_only` inserts a row; `upsert` replaces the row of its
    # primary key (a tombstone or `delete_field` deletes it); `insert_delete` states its diff
    # (`diff_field`; Debezium: `before` -1, `after` +1).
    semantics: Literal["append_only", "upsert", "insert_delete"] = "append_only"
    # Column name -> dotted path in the JSON value (in `before`/`after` for Debezium); a column
    # not listed is read from the top-level field of the same name.
    fields: dict[str, str] = Field(default_factory=dict)
    # Column name -> message part; these columns are not read from the value.
    metadata: dict[str, KafkaMetadata] = Field(default_factory=dict)
    # insert_delete over JSON: the field stating the diff. Without `diff_values` it is a
    # non-zero integer; with it, a string mapped through it (e.g. {"insert": 1, "delete": -1}).
    diff_field: str = "diff"
    # The diff each string value of `diff_field` means (see above).
    diff_values: dict[str, int] | None = None
    # upsert over JSON: a boolean field that marks a delete of the record's key.
    delete_field: str | None = None
    # Where records carry their upstream transaction id; null: mini-batches (`transactions`).
    upstream: UpstreamTransactions | None = None
    # Debezium only, as the connector's `decimal.handling.mode`: `precise` (Debezium's default)
    # is base64 of the unscaled value's big-endian two's-complement bytes; `string` and
    # `double` are JSON text, read exactly like a JSON source's decimals.
    decimal_handling_mode: Literal["precise", "string", "double"] | None = None
    # Debezium only: the connector writing the topic, which fixes the shape of its transaction
    # ids; None reads it from each change's `source.connector`.
    connector: DebeziumConnector | None = None
    # Debezium only, as the connector's `unavailable.value.placeholder` (None: Debezium's
    # default): a text column holding it, or its base64 (bytes columns), is an unchanged TOAST
    # value.
    unavailable_value_placeholder: str | None = Field(default=None, min_length=1)
    # A larger value is dead-lettered without being decoded.
    max_value_bytes: int = Field(default=1_000_000, gt=0)
    # A record rejected by field validation: quote the offending value (up to 80 characters)
    # in its reason, which is logged and put in the dead letter's `txstream.error` header. Off,
    # the reason names the field and the problem only: logs often go where the data may not,
    # and the dead letter holds the whole record anyway.
    value_excerpts: bool = False

    @property
    def schema(self) -> TableSchema:  # type: ignore[override]
        """The table this source feeds (the field is `table_schema`, spelled `schema` outside)."""
        return self.table_schema

    @field_validator("table_schema")
    @classmethod
    def _keys_required(cls, schema: TableSchema) -> TableSchema:
        """A primary key column is required whatever the schema declares: a row without its key
        cannot be upserted, deleted or retracted, so such a record is dead-lettered."""
        key = set(schema.primary_key)
        if all(not c.nullable for c in schema.columns if c.name in key):
            return schema
        return schema.model_copy(update={"columns": tuple(
            c.model_copy(update={"nullable": False}) if c.name in key else c
            for c in schema.columns)})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise SourceSpecError("a source needs a non-empty name")
        return v

    @model_validator(mode="after")
    def _check(self) -> SourceSpec:
        names = set(self.table_schema.names)
        for col in [*self.fields, *self.metadata]:
            if col not in names:
                raise SourceSpecError(
                    f"source {self.name!r}: {col!r} is not a column of its schema "
                    f"({', '.join(self.table_schema.names)})"
                )
        for path in self.fields.values():
            split_path(path)
        overlap = set(self.fields) & set(self.metadata)
        if overlap:
            raise SourceSpecError(
                f"source {self.name!r}: column(s) {sorted(overlap)} are both value fields and "
                "metadata; list each column in one place"
            )
        for col, part in self.metadata.items():
            ctype = self.table_schema.column(col).type
            if ctype not in METADATA_TYPES[part]:
                allowed = ", ".join(sorted(t.value for t in METADATA_TYPES[part]))
                raise SourceSpecError(
                    f"source {self.name!r}: metadata column {col!r} ({part.value}) is declared "
                    f"{ctype.value}; declare it as {allowed}"
                )
        if self.semantics == "upsert":
            if not self.table_schema.primary_key:
                raise SourceSpecError(
                    f"source {self.name!r}: upsert semantics needs a primary key in its schema"
                )
            meta_keys = set(self.table_schema.primary_key) & set(self.metadata)
            if meta_keys:
                raise SourceSpecError(
                    f"source {self.name!r}: primary key column(s) {sorted(meta_keys)} must come "
                    "from the value, not from message metadata"
                )
        if self.semantics == "insert_delete" and self.format == "json":
            split_path(self.diff_field)
            if self.diff_field in names:
                raise SourceSpecError(
                    f"source {self.name!r}: diff_field {self.diff_field!r} is also a column; the "
                    "diff is change metadata, remove it from the schema"
                )
        if self.format == "debezium" and self.semantics == "append_only":
            raise SourceSpecError(
                f"source {self.name!r}: Debezium envelopes carry deletes and updates; use "
                "semantics 'insert_delete' (before -> -1, after -> +1) or 'upsert'"
            )
        if self.format == "debezium_flattened" and self.semantics != "upsert":
            raise SourceSpecError(
                f"source {self.name!r}: the flattened form (ExtractNewRecordState) carries each "
                "row's new state only, a delete its key: use semantics 'upsert'")
        if self.decimal_handling_mode is not None and not self.debezium:
            raise SourceSpecError(
                f"source {self.name!r}: decimal_handling_mode describes a Debezium connector; "
                "a JSON source reads decimals from JSON numbers and numeric strings")
        debezium_only = [name for name in ("connector", "unavailable_value_placeholder")
                         if getattr(self, name) is not None and not self.debezium]
        if debezium_only:
            raise SourceSpecError(f"source {self.name!r}: setting(s) {debezium_only} apply to "
                                  "Debezium sources only; set format 'debezium' (or "
                                  "'debezium_flattened') or remove them")
        if (self.value_format != "json") != (self.schema_registry_url is not None):
            raise SourceSpecError(
                f"source {self.name!r}: value_format {self.value_format!r} and "
                "schema_registry_url go together: values in Confluent's wire format (avro, "
                "json_schema, protobuf) name their writer schema by an id the registry resolves")
        if self.diff_values is not None and any(v == 0 for v in self.diff_values.values()):
            raise SourceSpecError(f"source {self.name!r}: diff_values may not map to 0")
        if self.delete_field is not None:
            split_path(self.delete_field)
            if self.semantics != "upsert" or self.format != "json":
                raise SourceSpecError(
                    f"source {self.name!r}: delete_field applies to JSON upsert sources only"
                )
        return self

    @property
    def debezium(self) -> bool:
        """Written by a Debezium connector, as its change events or flattened."""
        return self.format in ("debezium", "debezium_flattened")

    @property
    def precise_decimals(self) -> bool:
        """Whether decimal values come base64-encoded (Debezium's `precise` mode over JSON, framed
        by the JSON Schema serializer or not; Avro and Protobuf carry them as their decimal
        types, decoded to numbers)."""
        return (self.debezium and self.value_format in ("json", "json_schema")
                and self.decimal_handling_mode in (None, "precise"))

    @property
    def placeholder(self) -> str | None:
        """The value of an unchanged TOAST column (Debezium sources only)."""
        if not self.debezium:
            return None
        return self.unavailable_value_placeholder or UNAVAILABLE_VALUE

    def value_columns(self) -> list[str]:
        """Columns read from the message value, in schema order."""
        return [c for c in self.table_schema.names if c not in self.metadata]

    def path_of(self, column: str) -> tuple[str, ...]:
        return split_path(self.fields.get(column, column))


class BatchPolicy(BaseModel):
    """Transaction boundaries for the whole pipeline.

    Records of sources without upstream transaction ids form mini-batches: a batch closes after
    `max_events` records or `max_delay_ms` after its first record, whichever comes first, and,
    with `close_when_caught_up`, as soon as the consumer has read every assigned partition (of
    every source and metadata topic) to its end. That last rule makes the batches follow the
    load: a lone event is not held back `max_delay_ms`, a backlog is still cut at `max_events`
    (or `max_delay_ms`), and at a steady rate the service keeps up with, a batch holds what was
    read before the consumer caught up, so transactions come up to about 20 a second (the
    service polls every 50 ms), each with its own output changes. Turn it off for fewer, larger
    transactions, each visible up to `max_delay_ms` later.
    An upstream transaction not complete `upstream_timeout_ms` after its first record (or its
    Debezium END event) is never emitted: its records go to the dead-letter topic (an aborted or
    lost upstream transaction). Emitting the part that arrived instead would break the
    transaction's atomicity, and a replay after a crash could not form the same part again.
    A pipeline that calls now() takes each transaction's wall time from its records' Kafka
    timestamps (the latest), and while every partition is read to its end and no transaction
    is open it gets a tick transaction (no changes, the wall time alone) every `tick_ms`, so
    that rows leave a `now()` filter without new data (0: no ticks).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_events: int = Field(default=10_000, gt=0)
    tick_ms: int = Field(default=1_000, ge=0)
    max_delay_ms: int = Field(default=1_000, ge=0)
    close_when_caught_up: bool = True
    upstream_timeout_ms: int = Field(default=60_000, gt=0)
    # The consumer's `isolation.level`: `read_committed` skips aborted and open Kafka
    # transactions (the id-change rule of `upstream` needs it).
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # Upper bound of records taken from the consumer per `poll` call.
    max_poll_records: int = Field(default=50_000, gt=0)
