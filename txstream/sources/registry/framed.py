"""Values in Confluent's wire format: magic byte 0, the 4-byte big-endian id of the writer
schema in a Schema Registry, then the body the serializer wrote (Avro binary, a JSON document,
or Protobuf's message indexes and message). Each `FramedValues` kind turns a body into the JSON
object the decoder reads for a JSON value of the same record (`txstream.sources.registry.avro`,
`.json_schema`, `.protobuf`), so everything after decoding (envelopes, columns,
checks, dead letters) is shared with JSON sources.

A record whose value is not in the wire format, names a schema that cannot be had (unknown id,
a registry that does not answer, a schema of another kind) or whose body does not decode is
given back with its reason, for the decoder to dead-letter with its original bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from txstream.sources.kafka_source import RawRecords

MAGIC = 0
HEADER = 5  # magic byte + schema id


class SchemaUnavailable(ValueError):
    """The writer schema of a record cannot be had; the message is the dead letter's reason (a
    ValueError: the value cannot be read, as a malformed one cannot)."""


class SchemaUnusable(SchemaUnavailable):
    """The registry's schema of an id cannot be read with (another kind, invalid, not
    compiling): a registered schema never changes, so this is kept rather than asked again."""


@dataclass(frozen=True)
class Reference:
    """A schema that another one imports, as the registry names it."""

    name: str  # how the importing schema names it (Avro: a type's full name; Protobuf: a file)
    subject: str
    version: int


@dataclass(frozen=True)
class WriterSchema:
    """A schema as the registry holds it."""

    text: str
    schema_type: str  # AVRO, JSON or PROTOBUF, as the registry names them
    references: tuple[Reference, ...] = ()


class WriterSchemas(Protocol):
    def schema(self, schema_id: int) -> WriterSchema:
        """The schema registered as `schema_id`; raise SchemaUnavailable when there is none."""
        ...

    def version(self, subject: str, version: int) -> WriterSchema:
        """Version `version` of `subject` (a reference); SchemaUnavailable when there is none."""
        ...


def resolved(schemas: WriterSchemas, schema: WriterSchema, schema_id: int
             ) -> list[tuple[str, WriterSchema]]:
    """The schemas `schema` (registered as `schema_id`) imports, transitively, each before
    those importing it, by the name it is imported as (each once)."""
    out: dict[str, WriterSchema] = {}

    def visit(of: WriterSchema, path: tuple[str, ...]) -> None:
        for ref in of.references:
            if ref.name in path:
                raise SchemaUnusable(f"the references of schema id {schema_id} form a cycle: "
                                     f"{' -> '.join((*path, ref.name))}")
            if ref.name not in out:
                imported = schemas.version(ref.subject, ref.version)
                visit(imported, (*path, ref.name))
                out[ref.name] = imported

    visit(schema, ())
    return list(out.items())


class FramedValues(ABC):
    """Transcodes a source's framed values to JSON (see the module doc); one subclass per
    serializer, each writer schema parsed once per id and kept."""

    schema_type: ClassVar[str]  # the registry's name of the schemas this kind reads
    value_format: ClassVar[str]  # the source's `value_format`
    serializer: ClassVar[str]  # what a producer must use, for reasons

    def __init__(self, schemas: WriterSchemas) -> None:
        self._schemas = schemas
        self._parsed: dict[int, Any] = {}
        self._unusable: dict[int, str] = {}  # schema id -> why (SchemaUnusable)

    def transcode(self, records: RawRecords) -> tuple[RawRecords, dict[int, str]]:
        """`records` with each value as JSON (tombstones stay None) and the reasons of the
        values that cannot be decoded, by index (those keep their original bytes)."""
        values: list[bytes | None] = list(records.values)
        failed: dict[int, str] = {}
        # Schema ids that failed in this batch: a registry that is down is asked once per id
        # and batch, not once per record.
        missing: dict[int, str] = {}
        for i, value in enumerate(values):
            if value is None:
                continue
            try:
                values[i] = self.json_of(value, missing)
            except ValueError as exc:
                failed[i] = str(exc)
        return replace(records, values=values), failed

    def json_of(self, value: bytes, missing: dict[int, str] | None = None) -> bytes:
        """`value` as JSON; ValueError (SchemaUnavailable among them) says why it cannot be
        read. `missing`: the reasons of the schema ids already found unavailable, added to."""
        if len(value) < HEADER or value[0] != MAGIC:
            first = f"starts with byte {value[0]}" if value else "is empty"
            raise ValueError(
                f"value {first} and {len(value)} bytes: not Confluent's wire format (magic "
                f"byte 0, 4-byte schema id); the producer needs the Schema Registry's "
                f"{self.serializer}, or set the source's value_format to how it writes")
        schema_id = int.from_bytes(value[1:HEADER], "big")
        writer = self._parsed.get(schema_id)
        if writer is None:
            if missing is not None and schema_id in missing:
                raise SchemaUnavailable(missing[schema_id])
            try:
                writer = self.writer(schema_id)
            except SchemaUnavailable as exc:
                if missing is not None:
                    missing[schema_id] = str(exc)
                raise
        return self._decode(writer, value[HEADER:], schema_id)

    def writer(self, schema_id: int) -> Any:
        """The parsed writer schema of `schema_id`, asked of the registry and parsed, then
        kept; SchemaUnavailable says why there is none."""
        if schema_id in self._parsed:
            return self._parsed[schema_id]
        if schema_id in self._unusable:
            raise SchemaUnusable(self._unusable[schema_id])
        schema = self._schemas.schema(schema_id)
        try:
            if schema.schema_type != self.schema_type:
                raise SchemaUnusable(
                    f"schema id {schema_id} is a {schema.schema_type} schema; this source "
                    f"reads {self.schema_type} (value_format {self.value_format!r})")
            imports = resolved(self._schemas, schema, schema_id)
            for name, imported in imports:
                if imported.schema_type != self.schema_type:
                    raise SchemaUnusable(f"schema id {schema_id} imports {name!r}, a "
                                         f"{imported.schema_type} schema")
            parsed = self._parsed[schema_id] = self._parse(schema, imports, schema_id)
        except SchemaUnusable as exc:
            self._unusable[schema_id] = str(exc)
            raise
        return parsed

    @abstractmethod
    def _parse(self, schema: WriterSchema, imports: list[tuple[str, WriterSchema]],
               schema_id: int) -> Any:
        """The form of `schema` that `_decode` reads with, given the schemas it imports
        (`resolved`); SchemaUnusable if it cannot be one, SchemaUnavailable if it cannot be
        now."""

    @abstractmethod
    def _decode(self, writer: Any, body: bytes, schema_id: int) -> bytes:
        """`body` as a JSON object; ValueError says why it does not decode."""
