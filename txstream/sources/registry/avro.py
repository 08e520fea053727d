"""Avro values in Confluent's wire format (`txstream.sources.registry.framed`), decoded by fastavro
with their writer schema and written again as the JSON object Kafka Connect's JsonConverter
would have written for the same record. The rest of the decoder then reads them exactly as it
reads JSON: Debezium's Avro envelope has the JSON envelope's field names (`before`, `after`,
`op`, `source`, `transaction`), a plain producer's record is the row, and fastavro decodes
unions into plain values.

What JSON lacks is written as the JSON decoder reads it (msgspec's encodings): decimals (Avro's
decimal logical type, which Debezium's `precise` decimals become) as numeric strings, read
exactly; timestamps, dates and times (Avro's logical types) as ISO-8601 text; bytes as base64,
as JsonConverter writes them (so a bytes column's TOAST placeholder still matches); a NaN or
infinite double as null. Fields are read by name with the writer's schema: a field the
producer added is ignored, one it removed reads as null (nullable columns) or fails the record
as a missing required field, so a schema that evolves needs no restart.

Cost: fastavro builds each record as Python objects (about 10 us for a ~200-byte row, most of
it the values themselves: a container file of the same records decodes no faster), so records
are read one by one with their own writer schema, which also proves each body ends where its
record does; msgspec writes the JSON at a small fraction of that.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import msgspec
from fastavro import schemaless_reader

from txstream.sources.registry.framed import FramedValues, SchemaUnusable, WriterSchema

# What fastavro raises on a body that does not match its schema (truncated, an out-of-range
# union branch, bad UTF-8, a negative length...).
_CORRUPT = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error,
            MemoryError)
_JSON = msgspec.json.Encoder()


class AvroValues(FramedValues):
    """Transcodes a source's Avro values to JSON (see the module doc)."""

    schema_type = "AVRO"
    value_format = "avro"
    serializer = "Avro serializer"

    def _parse(self, schema: WriterSchema, imports: list[tuple[str, WriterSchema]],
               schema_id: int) -> Any:
        # The named types of the imported schemas, parsed first, are what the schema's own
        # names resolve to.
        named: dict[str, Any] = {}
        try:
            for _, imported in imports:
                fastavro.parse_schema(json.loads(imported.text), named_schemas=named)
            return fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
        except (ValueError, fastavro.schema.SchemaParseException) as exc:  # UnknownType too
            raise SchemaUnusable(f"schema id {schema_id} is no valid Avro schema: {exc}"
                                 ) from exc

    def _decode(self, writer: Any, body: bytes, schema_id: int) -> bytes:
        buf = io.BytesIO(body)
        try:
            record = schemaless_reader(buf, writer, None)
        except _CORRUPT as exc:
            raise ValueError(f"Avro body does not decode with writer schema id {schema_id} "
                             f"({type(exc).__name__}: {exc}); the record is corrupt or was "
                             "written with another registry's id") from exc
        if buf.tell() != len(body):
            raise ValueError(f"Avro body does not decode with writer schema id {schema_id} "
                             f"({len(body) - buf.tell()} bytes left after the record); the "
                             "record is corrupt or was written with another registry's id")
        if not isinstance(record, dict):
            raise ValueError(f"writer schema id {schema_id} is a {type(record).__name__}, "
                             "not a record")
        return _JSON.encode(record)
