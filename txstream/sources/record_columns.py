"""The columns a source's rows take from outside the row itself, read for a whole poll batch of
records at once (`txstream.sources.decoder` calls them with the records it parsed):

* the upstream transaction of each record (`SourceSpec.upstream`): its id, its record count and
  its end marker, from fields of the value or from Kafka headers; Debezium's ids made unique
  per connector (`txstream.sources.debezium.ids`);
* Kafka metadata the schema maps to columns (`SourceSpec.metadata`): the message key, headers
  (as a JSON object), topic, partition, offset and timestamp.

A record with no upstream transaction id (where every change belongs to one) or with no
positive record count is marked failed in `errors`, for the dead-letter topic.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.sources import KafkaMetadata, RecordField, SourceSpec, split_path
from txstream.sources.debezium.ids import transaction_ids
from txstream.sources.field_checks import RecordErrors, as_mask, header_values
from txstream.sources.json_values import ParsedJson
from txstream.sources.kafka_source import Headers, RawRecords


def _header(headers: Headers | None, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


def upstream_columns(spec: SourceSpec, parsed: ParsedJson, indices: np.ndarray,
                     records: RawRecords, errors: RecordErrors
                     ) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Upstream transaction id, expected count and end marker of each record (at `indices` of
    `records`, parsed as `parsed`)."""
    n = len(indices)
    upstream = spec.upstream
    no_end = pa.array(np.zeros(n, dtype=bool))
    if upstream is None:
        return pa.nulls(n, pa.string()), pa.nulls(n, pa.int64()), no_end

    def read(where: RecordField, dtype: pa.DataType) -> pa.Array:
        if where.field is not None:
            path = split_path(where.field)
            arr = parsed.envelope(path) if spec.debezium else parsed.get(path)
            return arr.cast(dtype)
        assert where.header is not None
        raw = [_header(records.headers[i], where.header) for i in indices]
        return header_values(
            pa.array([None if r is None else r.decode("utf-8", "replace") for r in raw],
                     pa.string()),
            dtype,
        )

    txid = read(upstream.id, pa.string())
    if spec.debezium:  # a flattened row names no connector: its ids by their shape
        named = _connectors(parsed) if spec.format == "debezium" else None
        txid = transaction_ids(txid, spec.connector or named)
    if upstream.metadata_topic is None:  # else a change outside transactions (a snapshot)
        errors.add(as_mask(pc.is_null(txid)),
                   f"no upstream transaction id ({_where(upstream.id)})")
    txcount = pa.nulls(n, pa.int64())
    if upstream.count is not None:
        txcount = read(upstream.count, pa.int64())
        errors.add(as_mask(pc.fill_null(pc.less(txcount, 1), True)),
                   f"no positive upstream record count ({_where(upstream.count)})")
    txend = no_end
    if upstream.end is not None:
        txend = pc.fill_null(read(upstream.end, pa.bool_()), False)
    return txid, txcount, txend


def _connectors(parsed: ParsedJson) -> pa.Array:
    """Each change's `source.connector` (null where it is not a string)."""
    named = parsed.envelope(("source", "connector"))
    return named if pa.types.is_string(named.type) else pa.nulls(len(named), pa.string())


def _where(where: RecordField) -> str:
    return f"field {where.field!r}" if where.field is not None else f"header {where.header!r}"


def metadata_columns(spec: SourceSpec, indices: np.ndarray, records: RawRecords
                     ) -> dict[str, pa.Array]:
    """The columns `spec.metadata` maps to Kafka metadata, for the records at `indices`."""
    out: dict[str, pa.Array] = {}
    for col, part in spec.metadata.items():
        dtype = spec.table_schema.column(col).type.arrow
        if part is KafkaMetadata.KEY:
            keys = [records.keys[i] for i in indices]
            values: list[Any] = [None if k is None else k.decode("utf-8", "replace")
                                 for k in keys]
        elif part is KafkaMetadata.HEADERS:
            values = [
                json.dumps({k: (v or b"").decode("utf-8", "replace")
                            for k, v in (records.headers[i] or ())})
                for i in indices
            ]
        elif part is KafkaMetadata.TOPIC:
            values = [records.topic] * len(indices)
        elif part is KafkaMetadata.PARTITION:
            values = [int(records.partitions[i]) for i in indices]
        elif part is KafkaMetadata.OFFSET:
            values = [int(records.offsets[i]) for i in indices]
        else:
            # (type, ms): type 0 is TIMESTAMP_NOT_AVAILABLE, which becomes null.
            values = [ms * 1000 if kind else None for kind, ms in
                      (records.timestamps[i] for i in indices)]
            out[col] = pa.array(values, pa.int64()).cast(dtype)
            continue
        out[col] = pa.array(values, dtype)
    return out
