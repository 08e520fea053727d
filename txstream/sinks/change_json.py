"""The JSON form of change rows, written by the Kafka and file sinks, read by `decode_changes`.

A change is one JSON object: the row's columns, then `time` and `diff`. Timestamps are ISO 8601
in UTC with microseconds (`2024-05-01T12:00:00.000000Z`), dates `YYYY-MM-DD`. Decimals are
strings with all their scale's digits (`"1751.30"`), as Debezium's `string` mode writes them:
many JSON readers would parse a number as a double and lose digits. JSON has no NaN or
infinity, so those doubles are the strings `"NaN"`, `"Infinity"` and `"-Infinity"`, as in the
protobuf JSON mapping; any other string in a double column is an error when decoding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF, TIME
from txstream.schemas.tables import TableSchema
from txstream.sinks.sink import SinkDataError


class ChangeDecodeError(SinkDataError):
    """A JSON change cannot be decoded; `index` is its position in the decoded batch (None when
    the problem is a column of the whole batch)."""

    def __init__(self, message: str, index: int | None) -> None:
        super().__init__(message)
        self.index = index


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _json_float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def json_columns(table: pa.Table) -> dict[str, list[Any]]:
    """Each column as a list of JSON-ready Python values (timestamps and dates as strings)."""
    out: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table[name]
        kind = column.type
        if pa.types.is_timestamp(kind):
            column = pc.strftime(column.cast(pa.timestamp("us", tz="UTC")),
                                 format="%Y-%m-%dT%H:%M:%SZ")
        elif pa.types.is_date(kind) or pa.types.is_decimal(kind):
            column = column.cast(pa.string())
        values = column.to_pylist()
        if pa.types.is_floating(kind) and not pc.all(pc.is_finite(column)).as_py():
            values = [_json_float(v) for v in values]
        out[name] = values
    return out


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows of `table` as JSON-ready dicts, columns in table order."""
    columns = json_columns(table)
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; refuses NaN and infinity, which `json_columns` already turned into
    strings."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def encode_rows(table: pa.Table) -> list[bytes]:
    """One compact JSON object per row of `table`."""
    return [dumps(row) for row in json_rows(table)]


def decode_changes(payloads: Iterable[bytes], schema: TableSchema) -> pa.Table:
    """The changes table (columns + `time` + `diff`) of JSON change objects; absent columns
    are null."""
    target = schema.arrow_schema(with_changes=True)
    columns: dict[str, list[Any]] = {name: [] for name in target.names}
    for number, payload in enumerate(payloads):
        try:
            record = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ChangeDecodeError(f"change #{number} is not JSON: {exc}", number) from exc
        if not isinstance(record, dict) or TIME not in record or DIFF not in record:
            raise ChangeDecodeError(
                f"change #{number} is not a change object with the columns, 'time' and 'diff'"
                " (an update-records topic cannot be read back as changes)", number,
            )
        for name, values in columns.items():
            values.append(record.get(name))
    arrays = []
    for field in target:
        values = columns[field.name]
        try:
            if pa.types.is_floating(field.type):
                values = [_NON_FINITE[v] if isinstance(v, str) else v for v in values]
            elif (pa.types.is_timestamp(field.type) or pa.types.is_date(field.type)
                  or pa.types.is_decimal(field.type)):
                arrays.append(pa.array(values, pa.string()).cast(field.type))
                continue
            arrays.append(pa.array(values, field.type))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ChangeDecodeError(
                f"column {field.name!r} has a value that is not a {field.type}: {exc}", None,
            ) from exc
    # Nullable fields: a sink that needs a value (a key, `time`, `diff`) says which one is null.
    return pa.Table.from_arrays(arrays, names=target.names)
