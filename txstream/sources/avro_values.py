"""Avro values in Confluent's wire format (magic byte 0, 4-byte big-endian schema id, Avro
binary body), decoded by fastavro with their writer schema and written again as the JSON
object Kafka Connect's JsonConverter would have written for the same record. The rest of the
decoder then reads them exactly as it reads JSON: Debezium's Avro envelope has the JSON
envelope's field names (`before`, `after`, `op`, `source`, `transaction`), a plain producer's
record is the row, and fastavro decodes unions into plain values.

What JSON lacks is written as the JSON decoder reads it: decimals (Avro's decimal logical type,
which Debezium's `precise` decimals become) as numeric strings, read exactly; timestamps, dates
and times (Avro's logical types) as ISO-8601 text; bytes as base64, as JsonConverter writes
them (so a bytes column's TOAST placeholder still matches). Fields are read by name with the
writer's schema: a field the producer added is ignored, one it removed reads as null (nullable
columns) or fails the record as a missing required field, so a schema that evolves needs no
restart.

A record whose value is not in the wire format, names a schema that cannot be had
(`txstream.sources.schema_registry`) or does not decode is given back with its reason, for the
decoder to dead-letter with its original bytes.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import struct
import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any, Protocol

from fastavro import schemaless_reader

from txstream.sources.kafka_source import RawRecords

MAGIC = 0
_HEADER = 5  # magic byte + schema id
# What fastavro raises on a body that does not match its schema (truncated, an out-of-range
# union branch, bad UTF-8, a negative length...).
_CORRUPT = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error,
            MemoryError)


class SchemaUnavailable(ValueError):
    """The writer schema of a record cannot be had; the message is the dead letter's reason (a
    ValueError: the value cannot be read, as a malformed one cannot)."""


class WriterSchemas(Protocol):
    def writer(self, schema_id: int) -> Any:
        """The parsed writer schema of `schema_id`; raise SchemaUnavailable when there is none."""
        ...


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"no JSON form for a decoded Avro {type(value).__name__}")


def frame(value: bytes) -> tuple[int, bytes]:
    """The schema id and Avro body of a value in Confluent's wire format; ValueError says why
    `value` is not in it."""
    if len(value) < _HEADER or value[0] != MAGIC:
        first = f"starts with byte {value[0]}" if value else "is empty"
        raise ValueError(f"value {first} and {len(value)} bytes: not Confluent's Avro wire "
                         "format (magic byte 0, 4-byte schema id); the producer needs the "
                         "Schema Registry's Avro serializer, or set value_format 'json'")
    return int.from_bytes(value[1:_HEADER], "big"), value[_HEADER:]


class AvroValues:
    """Transcodes a source's Avro values to JSON (see the module doc)."""

    def __init__(self, schemas: WriterSchemas) -> None:
        self._schemas = schemas

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
        schema_id, body = frame(value)
        if missing is not None and schema_id in missing:
            raise SchemaUnavailable(missing[schema_id])
        try:
            writer = self._schemas.writer(schema_id)
        except SchemaUnavailable as exc:
            if missing is not None:
                missing[schema_id] = str(exc)
            raise
        try:
            return self._decode(writer, body)
        except _CORRUPT as exc:
            raise ValueError(f"Avro body does not decode with writer schema id {schema_id} "
                             f"({type(exc).__name__}: {exc}); the record is corrupt or was "
                             "written with another registry's id") from exc

    @staticmethod
    def _decode(writer: Any, body: bytes) -> bytes:
        buf = io.BytesIO(body)
        record = schemaless_reader(buf, writer, None)
        if buf.tell() != len(body):
            raise ValueError(f"{len(body) - buf.tell()} bytes left after the record")
        if not isinstance(record, dict):
            raise ValueError(f"the writer schema is a {type(record).__name__}, not a record")
        return json.dumps(record, default=_json_default, separators=(",", ":")).encode()
