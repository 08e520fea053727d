"""Checks and conversions of decoded columns, a whole column at a time: each failing record
gets its first reason in a `RecordErrors`, and the decoder drops it to the dead-letter topic."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.tables import ColumnType
from txstream.sources.debezium.decimals import unscaled_decimals


def as_mask(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array without nulls as numpy."""
    return mask.to_numpy(zero_copy_only=False)


def json_type(ctype: ColumnType, precise_decimals: bool) -> pa.DataType:
    # Arrow's JSON reader takes date32 values as day numbers: dates are read as text instead,
    # and so are base64-encoded decimals.
    if ctype is ColumnType.DATE or (ctype.is_decimal and precise_decimals):
        return pa.string()
    return ctype.arrow


def base64_decimals(text: pa.Array, ctype: ColumnType, which: np.ndarray, errors: RecordErrors,
             where: str) -> pa.Array:
    """Debezium's base64 decimals; a value that is not one of the column's fails its record."""
    values, bad = unscaled_decimals(text, ctype.arrow)
    errors.add(bad & which, f"field {where!r} is not a base64-encoded {ctype} (Debezium's "
                            "decimal.handling.mode=precise); if the connector writes decimals "
                            "as strings or numbers, set the source's decimal_handling_mode")
    return values


def iso_dates(text: pa.Array, which: np.ndarray, errors: RecordErrors, where: str) -> pa.Array:
    """ISO dates (YYYY-MM-DD) from text; a value that is not one fails its record."""
    parsed = pc.strptime(text, format="%Y-%m-%d", unit="s", error_is_null=True)
    # strptime rolls impossible days over (Feb 30 -> Mar 1): only a round trip proves a date.
    same = pc.equal(pc.strftime(parsed, format="%Y-%m-%d"), text)
    errors.add(as_mask(pc.and_(pc.is_valid(text), pc.invert(pc.fill_null(same, False)))) & which,
               f"field {where!r} is not a date (YYYY-MM-DD)")
    return pc.cast(parsed, pa.date32())


def check_storable(values: pa.Array, which: np.ndarray, errors: RecordErrors, where: str) -> None:
    """Fail the records whose value decodes but no sink can store: PostgreSQL text holds no
    NUL character, and dates and timestamps outside years 1 to 9999 exist in Arrow but not in
    PostgreSQL (which has no year 0) nor in Python clients reading the output."""
    if pa.types.is_string(values.type):
        nul = pc.fill_null(pc.match_substring(values, "\x00"), False)
        errors.add(as_mask(nul) & which, f"field {where!r} contains a NUL character (\\u0000), "
                                     "which PostgreSQL text cannot store")
    elif pa.types.is_date(values.type) or pa.types.is_timestamp(values.type):
        year = pc.year(values)
        outside = pc.fill_null(pc.or_(pc.less(year, 1), pc.greater(year, 9999)), False)
        errors.add(as_mask(outside) & which, f"field {where!r} is outside year 1 to 9999, which "
                                         "PostgreSQL and most clients cannot hold")


def header_values(texts: pa.Array, dtype: pa.DataType) -> pa.Array:
    """Header texts as `dtype`; a value that is not one becomes null (and fails its record
    where the value is required) instead of failing the batch."""
    if dtype == pa.int64():
        digits = pc.fill_null(pc.match_substring_regex(texts, r"^\s*[+-]?\d{1,18}\s*$"), False)
        return pc.cast(pc.utf8_trim_whitespace(pc.if_else(digits, texts, None)), pa.int64())
    if dtype == pa.bool_():
        return pc.is_in(pc.utf8_lower(texts), value_set=pa.array(["true", "1"]))
    return texts


def braced(value: bytes) -> bool:
    """Whether the value starts with "{" and ends with "}" (JSON whitespace aside). Only such
    values reach Arrow's JSON reader: it crashes the process on a line that is a bare `null`
    (pyarrow 26)."""
    if value[:1] == b"{" and value[-1:] == b"}":
        return True
    stripped = value.strip(b" \t\r\n")
    return stripped[:1] == b"{" and stripped[-1:] == b"}"


class RecordErrors:
    """First failure reason per record of a batch, from vectorized masks; reasons are only
    formatted for the failing records."""

    def __init__(self, n: int) -> None:
        self.failed = np.zeros(n, dtype=bool)
        self.reasons: dict[int, str] = {}

    def add(self, mask: np.ndarray, reason: str | Callable[[int], str]) -> None:
        new = mask & ~self.failed
        for i in np.flatnonzero(new):
            self.reasons[int(i)] = reason(int(i)) if callable(reason) else reason
        self.failed |= new

