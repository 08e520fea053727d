"""JSON values framed by Confluent's JSON Schema serializer (`txstream.sources.registry.framed`:
magic byte 0, the schema id, then the JSON document as is). The frame is taken off once the id
is known to the registry as a JSON Schema; the document is then read exactly as a JSON value.

The JSON Schema itself is not applied to the records: the source's declared columns govern, as
for JSON (types, required columns, every check and dead letter). Validating each document with
a JSON Schema validator in Python would cost more than all of the decoding, and the serializer
validated it when it was written.
"""

from __future__ import annotations

import json
from typing import Any

from txstream.sources.registry.framed import FramedValues, SchemaUnusable, WriterSchema


class JsonSchemaValues(FramedValues):
    """Unframes a source's JSON Schema values (see the module doc)."""

    schema_type = "JSON"
    value_format = "json_schema"
    serializer = "JSON Schema serializer"

    def _parse(self, schema: WriterSchema, imports: list[tuple[str, WriterSchema]],
               schema_id: int) -> Any:
        # The schemas it imports ($ref to other subjects) would matter only to a validator.
        try:
            return json.loads(schema.text)
        except ValueError as exc:
            raise SchemaUnusable(f"schema id {schema_id} is no valid JSON Schema: {exc}"
                                    ) from exc

    def _decode(self, writer: Any, body: bytes, schema_id: int) -> bytes:
        return body
