"""The few records a decoder reads one at a time: upsert tombstones (no value, the row's key in
the record's key) and the upstream transaction of a bad record (so that a poison record still
counts towards its transaction's expected count)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from txstream.schemas.sources import RecordField, SourceSpec, split_path
from txstream.schemas.tables import ColumnType
from txstream.sources.debezium.ids import transaction_id
from txstream.sources.json_values import walk
from txstream.sources.kafka_source import BadRecord, Headers, bookkeeping


def upstream_of(spec: SourceSpec, headers: Headers | None, value: Any
                ) -> tuple[str | None, int | None, bool]:
    """One record's upstream transaction id, expected count and end marker, read from its
    `headers` or its parsed JSON `value` (None when it has none or is not JSON)."""
    upstream = spec.upstream
    assert upstream is not None

    def read(where: RecordField | None) -> Any:
        if where is None:
            return None
        if where.header is not None:
            found = next((v for k, v in headers or () if k == where.header), None)
            return None if found is None else found.decode("utf-8", "replace").strip()
        assert where.field is not None
        path = split_path(where.field)
        hit = walk(value, path)
        if hit is None and spec.debezium:
            hit = walk(value, ("payload", *path))
        return hit

    txid, count, end = read(upstream.id), read(upstream.count), read(upstream.end)
    if txid is not None and spec.debezium:
        named = spec.connector or read(RecordField(field="source.connector"))
        txid = transaction_id(str(txid), named if isinstance(named, str) else None)
    try:
        count_int = None if count is None else int(count)
    except (TypeError, ValueError):
        count_int = None
    ended = end is True or (isinstance(end, str) and end.lower() in ("true", "1"))
    return (None if txid is None else str(txid)), count_int, ended


def with_upstream(spec: SourceSpec, bad: BadRecord) -> BadRecord:
    """`bad` with its upstream transaction, as far as it can be read (best effort)."""
    upstream = spec.upstream
    assert upstream is not None
    value: Any = None
    in_value = [w for w in (upstream.id, upstream.count, upstream.end)
                if w is not None and w.field is not None]
    if bad.value is not None and in_value:
        try:
            value = json.loads(bad.value)
        except (ValueError, RecursionError):
            value = None
    txid, txcount, txend = upstream_of(spec, bad.headers, value)
    return bad.model_copy(
        update={"upstream_id": txid, "upstream_count": txcount, "upstream_end": txend}
    )


def tombstone_rows(spec: SourceSpec, out_schema: pa.Schema, indices: list[int],
                   keys: Sequence[bytes | None], headers: Sequence[Headers | None],
                   excerpt: Callable[[bytes | Exception], str]
                   ) -> tuple[pa.Table, dict[int, str]]:
    """Upsert deletes from the tombstones at `indices`: the key columns come from the record's
    key (a JSON object of the key columns, optionally in a Debezium `payload`, or for a
    one-column key its JSON scalar or raw text). Returns the rows (`out_schema`, each one's
    sequence column holding its record's index) and the reasons of the tombstones rejected, by
    index. A tombstone of a source with upstream transactions needs an id in a header, except
    a Debezium tombstone read beside transaction metadata: it has none, and is kept only if its
    key has a row (`txstream.sources.debezium.rows`). Tombstones are few, so this is per
    record."""
    pk = list(spec.table_schema.primary_key)
    rows: list[dict[str, Any]] = []
    kept: list[int] = []
    errors: dict[int, str] = {}
    for i in indices:
        raw = keys[i]
        assert raw is not None  # null keys on upsert sources are rejected before
        try:
            # Numbers as decimals: a decimal key's digits exactly, not as a float rounds them.
            key: Any = json.loads(raw, parse_float=Decimal)
        except (ValueError, RecursionError):
            key = raw.decode("utf-8", "replace")
        if isinstance(key, dict) and isinstance(key.get("payload"), dict):
            key = key["payload"]
        row = {c: key.get(c) for c in pk} if isinstance(key, dict) else (
            {pk[0]: key} if len(pk) == 1 else {}
        )
        if any(row.get(c) is None for c in pk):
            errors[i] = (f"tombstone key{excerpt(raw)} does not carry the primary "
                         f"key {pk}; use a JSON object of the key columns as the message key")
            continue
        try:
            row = {c: _key_value(spec.table_schema.column(c).type, v) for c, v in row.items()}
        except (ValueError, TypeError, ArithmeticError) as exc:
            errors[i] = f"tombstone key does not match the primary key types{excerpt(exc)}"
            continue
        txid, txcount, txend = None, None, False
        if spec.upstream is not None:
            txid, txcount, txend = upstream_of(spec, headers[i], None)
            if txid is None and not (spec.debezium and spec.upstream.metadata_topic):
                errors[i] = ("tombstone without an upstream transaction id; tombstones have "
                             "no value, so put the id in a header")
                continue
        rows.append({**row, **bookkeeping(i, 1, True, txid, txcount, txend)})
        kept.append(i)
    try:
        table = pa.Table.from_pylist(rows, schema=out_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        table = out_schema.empty_table()
        for i, row in zip(kept, rows, strict=True):
            try:
                table = pa.concat_tables([table, pa.Table.from_pylist([row], schema=out_schema)])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                errors[i] = f"tombstone key does not match the primary key types{excerpt(exc)}"
    return table, errors


def _key_value(kind: ColumnType, value: Any) -> Any:
    """A key column's JSON `value` as a row's value of its column `kind`: times, dates and
    decimals from their text, as a record's value gives them (a time without a zone is UTC)."""
    if not isinstance(value, str):
        if kind.is_decimal and isinstance(value, int):
            return Decimal(value)
        return float(value) if isinstance(value, Decimal) and not kind.is_decimal else value
    if kind is ColumnType.TIMESTAMP:
        at = datetime.fromisoformat(value)
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    if kind is ColumnType.DATE:
        return date.fromisoformat(value)
    return Decimal(value) if kind.is_decimal else value
