"""Kafka source decoding: one poll batch of one topic -> an Arrow table of rows (vectorized), with
every record that cannot be decoded or validated isolated as a `BadRecord` for the dead-letter
topic.

The whole batch is parsed by one `pyarrow.json.read_json` call with an explicit schema; when it
fails, the batch is bisected so that only the bad records fall back to single-record parsing
(O(bad * log n) parser calls), and the good records of the batch are kept.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pydantic import BaseModel, ConfigDict, ValidationError

from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.schemas.sources import (
    KafkaMetadata,
    RecordField,
    SourceSpec,
    SourceSpecError,
    row_model,
    split_path,
)
from txstream.schemas.tables import ColumnType
from txstream.sources.debezium_decimals import unscaled_decimals

log = logging.getLogger(__name__)

# Bookkeeping columns of a decoded rows table, next to the source's own columns.
SEQ = "_seq"  # position of the record in the pipeline's consumption order
DIFF = "_diff"  # +1 / -1 (append_only, insert_delete); +1 for upserts
DELETE = "_delete"  # upsert: the record deletes its key
TXID = "_txid"  # upstream transaction id (null without upstream transactions)
TXCOUNT = "_txcount"  # expected record count of the upstream transaction, when carried
TXEND = "_txend"  # the record carries the upstream transaction's end marker
BOOKKEEPING = (SEQ, DIFF, DELETE, TXID, TXCOUNT, TXEND)

_DEBEZIUM_OPS = ("c", "r", "u", "d")
_Tree = dict[str, "pa.DataType | _Tree"]


class KafkaSourceError(RuntimeError):
    """The Kafka input side cannot go on (broker error, missing topic, dead-letter failure)."""


class BadRecord(BaseModel):
    """A record that could not be decoded or validated, with everything needed to replay it."""

    model_config = ConfigDict(frozen=True)

    source: str
    topic: str
    partition: int
    offset: int
    seq: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    error: str
    # Known when the id is in a header or the value is JSON despite the failure: the record
    # still counts towards its upstream transaction's expected count.
    upstream_id: str | None = None
    upstream_count: int | None = None
    upstream_end: bool = False


@dataclass
class DecodedBatch:
    rows: pa.Table  # the source's columns + BOOKKEEPING, records in consumption order
    bad: list[BadRecord]
    ignored_tombstones: int  # Debezium's compaction tombstones after deletes (no row in them)


def rows_schema(spec: SourceSpec) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, c.type.arrow) for c in spec.table_schema.columns]
        + [
            pa.field(SEQ, pa.int64()),
            pa.field(DIFF, pa.int64()),
            pa.field(DELETE, pa.bool_()),
            pa.field(TXID, pa.string()),
            pa.field(TXCOUNT, pa.int64()),
            pa.field(TXEND, pa.bool_()),
        ]
    )


def _np(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array without nulls as numpy."""
    return mask.to_numpy(zero_copy_only=False)


def _json_type(ctype: ColumnType, precise_decimals: bool) -> pa.DataType:
    # Arrow's JSON reader takes date32 values as day numbers: dates are read as text instead,
    # and so are base64-encoded decimals.
    if ctype is ColumnType.DATE or (ctype.is_decimal and precise_decimals):
        return pa.string()
    return ctype.arrow


def _precise(text: pa.Array, ctype: ColumnType, which: np.ndarray, errors: _Errors,
             where: str) -> pa.Array:
    """Debezium's base64 decimals; a value that is not one of the column's fails its record."""
    values, bad = unscaled_decimals(text, ctype.arrow)
    errors.add(bad & which, f"field {where!r} is not a base64-encoded {ctype} (Debezium's "
                            "decimal.handling.mode=precise); if the connector writes decimals "
                            "as strings or numbers, set the source's decimal_handling_mode")
    return values


def _dates(text: pa.Array, which: np.ndarray, errors: _Errors, where: str) -> pa.Array:
    """ISO dates (YYYY-MM-DD) from text; a value that is not one fails its record."""
    parsed = pc.strptime(text, format="%Y-%m-%d", unit="s", error_is_null=True)
    # strptime rolls impossible days over (Feb 30 -> Mar 1): only a round trip proves a date.
    same = pc.equal(pc.strftime(parsed, format="%Y-%m-%d"), text)
    errors.add(_np(pc.and_(pc.is_valid(text), pc.invert(pc.fill_null(same, False)))) & which,
               f"field {where!r} is not a date (YYYY-MM-DD)")
    return pc.cast(parsed, pa.date32())


def _storable(values: pa.Array, which: np.ndarray, errors: _Errors, where: str) -> None:
    """Fail the records whose value decodes but no sink can store: PostgreSQL text holds no
    NUL character, and dates and timestamps outside years 1 to 9999 exist in Arrow but not in
    PostgreSQL (which has no year 0) nor in Python clients reading the output."""
    if pa.types.is_string(values.type):
        nul = pc.fill_null(pc.match_substring(values, "\x00"), False)
        errors.add(_np(nul) & which, f"field {where!r} contains a NUL character (\\u0000), "
                                     "which PostgreSQL text cannot store")
    elif pa.types.is_date(values.type) or pa.types.is_timestamp(values.type):
        year = pc.year(values)
        outside = pc.fill_null(pc.or_(pc.less(year, 1), pc.greater(year, 9999)), False)
        errors.add(_np(outside) & which, f"field {where!r} is outside year 1 to 9999, which "
                                         "PostgreSQL and most clients cannot hold")


def _header_values(texts: pa.Array, dtype: pa.DataType) -> pa.Array:
    """Header texts as `dtype`; a value that is not one becomes null (and fails its record
    where the value is required) instead of failing the batch."""
    if dtype == pa.int64():
        digits = pc.fill_null(pc.match_substring_regex(texts, r"^\s*[+-]?\d{1,18}\s*$"), False)
        return pc.cast(pc.utf8_trim_whitespace(pc.if_else(digits, texts, None)), pa.int64())
    if dtype == pa.bool_():
        return pc.is_in(pc.utf8_lower(texts), value_set=pa.array(["true", "1"]))
    return texts


def _braced(value: bytes) -> bool:
    """Whether the value starts with "{" and ends with "}" (JSON whitespace aside). Only such
    values reach Arrow's JSON reader: it crashes the process on a line that is a bare `null`
    (pyarrow 26)."""
    if value[:1] == b"{" and value[-1:] == b"}":
        return True
    stripped = value.strip(b" \t\r\n")
    return stripped[:1] == b"{" and stripped[-1:] == b"}"


def _header(message: Message, name: str) -> bytes | None:
    for key, value in message.headers() or ():
        if key == name:
            return value
    return None


def _tree_insert(tree: _Tree, path: tuple[str, ...], dtype: pa.DataType) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SourceSpecError(f"path {'.'.join(path)!r} runs through the leaf field {part!r}")
        node = child
    if path[-1] in node and node[path[-1]] != dtype:
        raise SourceSpecError(f"path {'.'.join(path)!r} is declared twice with different types")
    node[path[-1]] = dtype


def _tree_type(tree: _Tree) -> list[pa.Field]:
    return [
        pa.field(name, pa.struct(_tree_type(sub)) if isinstance(sub, dict) else sub)
        for name, sub in tree.items()
    ]


def _walk(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


class _Parsed:
    """A parsed batch: nested columns looked up by path, null where any level is absent."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def get(self, path: tuple[str, ...]) -> pa.Array:
        arr = self._table.column(path[0]).combine_chunks()
        for part in path[1:]:
            arr = pc.struct_field(arr, [part])
        return arr

    def envelope(self, path: tuple[str, ...]) -> pa.Array:
        """Debezium: the field inside the `payload` wrapper when there is one, else at the top."""
        return pc.coalesce(self.get(("payload", *path)), self.get(path))

    def present(self, path: tuple[str, ...]) -> np.ndarray:
        """Debezium: whether the envelope has a non-null struct at `path`."""
        return _np(pc.or_(
            pc.is_valid(self.get(("payload", *path))), pc.is_valid(self.get(path))
        ))


class _Errors:
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


class SourceDecoder:
    """Decodes and validates the messages of one source, a whole poll batch at a time."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._schema = spec.table_schema
        self._value_cols = spec.value_columns()
        self._debezium = spec.format == "debezium"
        self._out_schema = rows_schema(spec)
        self._row_model = row_model(spec.table_schema, self._value_cols, f"{spec.name}_row")
        tree: _Tree = {}
        prefixes: list[tuple[str, ...]] = (
            [("before",), ("after",), ("payload", "before"), ("payload", "after")]
            if self._debezium
            else [()]
        )
        envelopes: list[tuple[str, ...]] = [(), ("payload",)] if self._debezium else [()]
        for prefix in prefixes:
            for col in self._value_cols:
                _tree_insert(tree, prefix + spec.path_of(col),
                             _json_type(self._schema.column(col).type,
                                        spec.precise_decimals))
        extra: list[tuple[tuple[str, ...], pa.DataType]] = []
        if self._debezium:
            extra.append((("op",), pa.string()))
        elif spec.semantics == "insert_delete":
            diff_type = pa.int64() if spec.diff_values is None else pa.string()
            extra.append((split_path(spec.diff_field), diff_type))
        if spec.delete_field is not None:
            extra.append((split_path(spec.delete_field), pa.bool_()))
        upstream = spec.upstream
        if upstream is not None:
            if upstream.id.field is not None:
                id_type = pa.string() if upstream.id_type == "text" else pa.int64()
                extra.append((split_path(upstream.id.field), id_type))
            if upstream.count is not None and upstream.count.field is not None:
                extra.append((split_path(upstream.count.field), pa.int64()))
            if upstream.end is not None and upstream.end.field is not None:
                extra.append((split_path(upstream.end.field), pa.bool_()))
        for envelope in envelopes:
            for path, dtype in extra:
                _tree_insert(tree, envelope + path, dtype)
        self._json_schema = pa.schema(_tree_type(tree))
        self._parse_options = pajson.ParseOptions(
            explicit_schema=self._json_schema, unexpected_field_behavior="ignore"
        )
        # A line must fit in one block of the reader.
        self._read_options = pajson.ReadOptions(
            block_size=max(1 << 20, spec.max_value_bytes + 1), use_threads=False
        )

    # ---- parsing -------------------------------------------------------------------------

    def _read(self, values: Sequence[bytes], payload: bytes | None = None) -> pa.Table | None:
        try:
            table = pajson.read_json(
                io.BytesIO(b"\n".join(values) if payload is None else payload),
                read_options=self._read_options,
                parse_options=self._parse_options,
            )
        except pa.ArrowInvalid:
            return None
        # Empty values vanish and two objects on one line count twice: either way the rows no
        # longer line up with the records, so the batch has a bad record in it.
        return table if table.num_rows == len(values) else None

    def _parse(self, values: list[bytes]) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
        """Parse records; returns the table of the good ones, their indices and the bad ones'
        parse errors by index."""
        payload = b"\n".join(values)
        if payload.count(b"\n") != len(values) - 1 or b"\r" in payload:
            # JSON text never needs a raw line break (strings escape them): make them spaces.
            values = [v.replace(b"\n", b" ").replace(b"\r", b" ") for v in values]
            payload = b"\n".join(values)
        tables: list[pa.Table] = []
        good: list[np.ndarray] = []
        errors: dict[int, str] = {}

        def run(lo: int, hi: int) -> None:
            whole = lo == 0 and hi == len(values)
            table = self._read(values[lo:hi], payload if whole else None)
            if table is not None:
                tables.append(table)
                good.append(np.arange(lo, hi))
            elif hi - lo == 1:
                errors[lo] = self._single_error(values[lo])
            else:
                mid = (lo + hi) // 2
                run(lo, mid)
                run(mid, hi)

        if values:
            run(0, len(values))
        table = (
            pa.concat_tables(tables) if tables else self._json_schema.empty_table()
        )
        indices = np.concatenate(good) if good else np.zeros(0, dtype=np.int64)
        return table, indices, errors

    def _single_error(self, value: bytes) -> str:
        """Why one record was rejected, in terms of the user's fields (pydantic), falling back
        to the Arrow reader's message."""
        explained = self._explain(value)
        if explained is not None:
            return explained
        try:
            pajson.read_json(
                io.BytesIO(value),
                read_options=self._read_options,
                parse_options=self._parse_options,
            )
        except pa.ArrowInvalid as exc:
            # The parser's message may quote the value.
            return f"value does not match the schema{self._excerpt(exc)}"
        return "value is not exactly one JSON object"

    def _excerpt(self, detail: bytes | Exception) -> str:
        """`detail` (a value, or an error quoting one) for a reason, only with the source's
        `value_excerpts`: reasons are logged."""
        if not self.spec.value_excerpts:
            return ""
        return f" ({detail[:80]!r})" if isinstance(detail, bytes) else f": {detail}"

    def _explain(self, value: bytes) -> str | None:
        """The problem of a rejected value found by Python's JSON parser and the row model."""
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError) as exc:
            return f"malformed JSON: {exc}"
        if not isinstance(obj, dict):
            return f"value is a JSON {type(obj).__name__}, not an object"
        if self._debezium:
            envelope = obj["payload"] if isinstance(obj.get("payload"), dict) else obj
            rows = [(f"{part}.", envelope.get(part)) for part in ("before", "after")]
        else:
            rows = [("", obj)]
        for prefix, row in rows:
            if not isinstance(row, dict):
                continue
            flat = {c: _walk(row, self.spec.path_of(c)) for c in self._value_cols}
            try:
                self._row_model.model_validate(flat)
            except ValidationError as exc:
                return "; ".join(
                    f"field {prefix + self.spec.fields.get(str(e['loc'][0]), str(e['loc'][0]))!r}"
                    f": {e['msg']}"
                    + (f" (got {e.get('input')!r:.80})" if self.spec.value_excerpts else "")
                    for e in exc.errors()
                )
        return None

    # ---- decoding ------------------------------------------------------------------------

    def _screen(self, messages: Sequence[Message], reject: Callable[[int, str], None]
                ) -> tuple[list[int], list[bytes], list[int]]:
        """The indices of the records to parse (in order) and their values, and the indices of
        the tombstones; `reject`s the others. Whole-batch checks pass the records whose value
        can only be one JSON object; the rest, usually none, are looked at one by one."""
        spec = self.spec
        upsert = spec.semantics == "upsert"
        raw = list(map(Message.value, messages))
        values = pa.array(raw, pa.binary())
        plain = pc.and_(pc.and_(pc.starts_with(values, b"{"), pc.ends_with(values, b"}")),
                        pc.less_equal(pc.binary_length(values), spec.max_value_bytes))
        fast = _np(pc.fill_null(plain, False))
        if upsert:
            fast &= np.fromiter((m.key() is not None for m in messages), bool, len(messages))
        if fast.all():
            return list(range(len(messages))), raw, []
        candidates = np.flatnonzero(fast).tolist()
        tombstones: list[int] = []
        for i in np.flatnonzero(~fast).tolist():
            message, value = messages[i], raw[i]
            if upsert and message.key() is None:
                reject(i, "null message key on an upsert source: the key identifies the row "
                          "to replace; produce the record with its primary key as the key")
            elif value is None:
                tombstones.append(i)
            elif len(value) > spec.max_value_bytes:
                reject(i, f"value of {len(value)} bytes exceeds max_value_bytes="
                          f"{spec.max_value_bytes} of source {spec.name!r}")
            elif not _braced(value):
                reject(i, self._explain(value) or "value is not a single JSON object")
            else:
                candidates.append(i)
        candidates.sort()
        return candidates, [raw[i] for i in candidates], tombstones

    def decode(self, messages: Sequence[Message], seqs: Sequence[int]) -> DecodedBatch:
        spec = self.spec
        bad: list[BadRecord] = []

        def reject(i: int, reason: str) -> None:
            bad.append(self.bad_record(messages[i], seqs[i], reason))

        candidates, values, tombstones = self._screen(messages, reject)

        parts: list[pa.Table] = []
        parsed, ok, parse_errors = self._parse(values)
        for local, reason in parse_errors.items():
            reject(candidates[local], reason)
        records = np.asarray(candidates, dtype=np.int64)[ok]
        if len(records):
            rows, errors = self._rows(_Parsed(parsed), records, messages)
            for local, reason in errors.reasons.items():
                reject(int(records[local]), reason)
            parts.append(rows)

        ignored = 0
        if tombstones:
            if spec.semantics == "upsert":
                rows, reasons = self._tombstone_rows(tombstones, messages)
                for i, reason in reasons.items():
                    reject(i, reason)
                parts.append(rows)
            elif self._debezium:
                ignored = len(tombstones)
                log.debug("source %s: %d Debezium tombstones ignored", spec.name, ignored)
            else:
                for i in tombstones:
                    reject(i, f"null value (tombstone) on a {spec.semantics} source; tombstones "
                              "delete rows only on upsert sources")

        seq_arr = np.asarray(seqs, dtype=np.int64)
        out = [
            p.set_column(p.schema.get_field_index(SEQ), SEQ,
                         pa.array(seq_arr[p.column(SEQ).to_numpy()]))
            for p in parts
            if p.num_rows
        ]
        table = pa.concat_tables(out) if out else self._out_schema.empty_table()
        if len(out) > 1:
            table = table.sort_by(SEQ)
        return DecodedBatch(rows=table, bad=self._with_upstream(bad), ignored_tombstones=ignored)

    def _rows(
        self, parsed: _Parsed, records: np.ndarray, messages: Sequence[Message]
    ) -> tuple[pa.Table, _Errors]:
        """The rows of the parsed records (SEQ holds the local message index) and the errors of
        the records that fail validation; only rows of valid records are returned."""
        spec = self.spec
        n = len(records)
        errors = _Errors(n)
        txid, txcount, txend = self._upstream_columns(parsed, records, messages, errors)
        meta = self._metadata_columns(records, messages)
        local = np.arange(n)

        def build(prefix: tuple[str, ...], which: np.ndarray, diff: int | pa.Array,
                  delete: bool, required: list[str]) -> tuple[pa.Table, np.ndarray]:
            cols: dict[str, pa.Array] = {}
            for col in spec.table_schema.names:
                if col in meta:
                    cols[col] = meta[col]
                elif self._debezium:
                    cols[col] = parsed.envelope((*prefix, *spec.path_of(col)))
                else:
                    cols[col] = parsed.get(spec.path_of(col))
                ctype = self._schema.column(col).type
                if col not in meta and ctype is ColumnType.DATE:
                    cols[col] = _dates(cols[col], which, errors, spec.fields.get(col, col))
                elif col not in meta and ctype.is_decimal and spec.precise_decimals:
                    cols[col] = _precise(cols[col], ctype, which, errors,
                                         spec.fields.get(col, col))
                if col not in meta:
                    _storable(cols[col], which, errors, spec.fields.get(col, col))
            for col in required:
                missing = _np(pc.is_null(cols[col])) & which
                where = spec.fields.get(col, col)
                errors.add(missing, f"missing or null required field {where!r} "
                                    f"(column {col!r})")
            diff_arr = pa.array(np.full(n, diff)) if isinstance(diff, int) else diff
            table = pa.table(
                {
                    **cols,
                    SEQ: pa.array(records),
                    DIFF: diff_arr,
                    DELETE: pa.array(np.full(n, delete)),
                    TXID: txid,
                    TXCOUNT: txcount,
                    TXEND: txend,
                },
                schema=self._out_schema,
            )
            return table, which

        required_all = [c.name for c in spec.table_schema.columns if not c.nullable]
        required_keys = list(spec.table_schema.primary_key)
        pieces: list[tuple[pa.Table, np.ndarray]] = []
        if self._debezium:
            op = parsed.envelope(("op",))

            def is_op(*ops: str) -> np.ndarray:
                return _np(pc.fill_null(pc.is_in(op, value_set=pa.array(ops)), False))

            def said(i: int) -> str:
                return repr(op[i].as_py())

            errors.add(~is_op(*_DEBEZIUM_OPS), lambda i: f"unknown Debezium op {said(i)}; "
                                                          "expected one of c, r, u, d")
            has_before = parsed.present(("before",))
            has_after = parsed.present(("after",))
            inserts = is_op("c", "r", "u")
            errors.add(inserts & ~has_after,
                       lambda i: f"Debezium op {said(i)} without an 'after' row")
            if spec.semantics == "upsert":
                deletes = is_op("d")
                errors.add(deletes & ~has_before, "Debezium delete without a 'before' row")
                pieces.append(build(("after",), inserts, 1, False, required_all))
                pieces.append(build(("before",), deletes, 1, True, required_keys))
            else:
                retracts = is_op("u", "d")
                errors.add(retracts & ~has_before, lambda i: f"Debezium op {said(i)} without "
                           "a 'before' row; insert_delete needs full before images (REPLICA "
                           "IDENTITY FULL), or use semantics 'upsert'")
                pieces.append(build(("after",), inserts, 1, False, required_all))
                pieces.append(build(("before",), retracts, -1, False, required_all))
        elif spec.semantics == "insert_delete":
            diff = self._diff_column(parsed, errors)
            pieces.append(build((), local >= 0, diff, False, required_all))
        elif spec.semantics == "upsert" and spec.delete_field is not None:
            flag = parsed.get(split_path(spec.delete_field))
            deletes = _np(pc.fill_null(flag, False))
            pieces.append(build((), ~deletes, 1, False, required_all))
            pieces.append(build((), deletes, 1, True, required_keys))
        else:
            pieces.append(build((), local >= 0, 1, False, required_all))

        valid = ~errors.failed
        kept = [t.filter(pa.array(which & valid)) for t, which in pieces]
        return pa.concat_tables(kept), errors

    def _diff_column(self, parsed: _Parsed, errors: _Errors) -> pa.Array:
        spec = self.spec
        raw = parsed.get(split_path(spec.diff_field))
        if spec.diff_values is None:
            diff = raw.cast(pa.int64())
            expected = "a non-zero integer"
        else:
            names = pa.array(list(spec.diff_values), pa.string())
            weights = pa.array(list(spec.diff_values.values()), pa.int64())
            diff = pc.take(weights, pc.index_in(raw, value_set=names))
            expected = f"one of {sorted(spec.diff_values)}"
        invalid = _np(pc.fill_null(pc.equal(diff, 0), True))
        errors.add(invalid, f"diff field {spec.diff_field!r} is missing or not {expected}")
        return pc.fill_null(diff, 0)

    def _upstream_columns(
        self, parsed: _Parsed, records: np.ndarray, messages: Sequence[Message], errors: _Errors
    ) -> tuple[pa.Array, pa.Array, pa.Array]:
        """Upstream transaction id, expected count and end marker of each record."""
        n = len(records)
        upstream = self.spec.upstream
        no_end = pa.array(np.zeros(n, dtype=bool))
        if upstream is None:
            return pa.nulls(n, pa.string()), pa.nulls(n, pa.int64()), no_end

        def read(where: RecordField, dtype: pa.DataType) -> pa.Array:
            if where.field is not None:
                path = split_path(where.field)
                arr = parsed.envelope(path) if self._debezium else parsed.get(path)
                return arr.cast(dtype)
            assert where.header is not None
            raw = [_header(messages[i], where.header) for i in records]
            return _header_values(
                pa.array([None if r is None else r.decode("utf-8", "replace") for r in raw],
                         pa.string()),
                dtype,
            )

        txid = read(upstream.id, pa.string())
        if upstream.metadata_topic is None:  # else a change outside transactions (a snapshot)
            errors.add(_np(pc.is_null(txid)),
                       f"no upstream transaction id ({self._where(upstream.id)})")
        txcount = pa.nulls(n, pa.int64())
        if upstream.count is not None:
            txcount = read(upstream.count, pa.int64())
            errors.add(_np(pc.fill_null(pc.less(txcount, 1), True)),
                       f"no positive upstream record count ({self._where(upstream.count)})")
        txend = no_end
        if upstream.end is not None:
            txend = pc.fill_null(read(upstream.end, pa.bool_()), False)
        return txid, txcount, txend

    @staticmethod
    def _where(where: RecordField) -> str:
        return f"field {where.field!r}" if where.field is not None else f"header {where.header!r}"

    def _metadata_columns(
        self, records: np.ndarray, messages: Sequence[Message]
    ) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        for col, part in self.spec.metadata.items():
            dtype = self._schema.column(col).type.arrow
            picked = [messages[i] for i in records]
            if part is KafkaMetadata.KEY:
                keys = [m.key() for m in picked]
                values: list[Any] = [None if k is None else k.decode("utf-8", "replace")
                                     for k in keys]
            elif part is KafkaMetadata.HEADERS:
                values = [
                    json.dumps({k: (v or b"").decode("utf-8", "replace")
                                for k, v in (m.headers() or ())})
                    for m in picked
                ]
            elif part is KafkaMetadata.TOPIC:
                values = [m.topic() for m in picked]
            elif part is KafkaMetadata.PARTITION:
                values = [m.partition() for m in picked]
            elif part is KafkaMetadata.OFFSET:
                values = [m.offset() for m in picked]
            else:
                # (type, ms): type 0 is TIMESTAMP_NOT_AVAILABLE, which becomes null.
                values = [ms * 1000 if kind else None for kind, ms in
                          (m.timestamp() for m in picked)]
                out[col] = pa.array(values, pa.int64()).cast(dtype)
                continue
            out[col] = pa.array(values, dtype)
        return out

    def _tombstone_rows(
        self, indices: list[int], messages: Sequence[Message]
    ) -> tuple[pa.Table, dict[int, str]]:
        """Upsert deletes from tombstones: the key columns come from the message key (a JSON
        object of the key columns, optionally in a Debezium `payload`, or for a one-column key
        its JSON scalar or raw text). Tombstones are few, so this is per record."""
        pk = list(self._schema.primary_key)
        rows: list[dict[str, Any]] = []
        kept: list[int] = []
        errors: dict[int, str] = {}
        upstream = self.spec.upstream
        for i in indices:
            raw = messages[i].key()
            assert raw is not None  # null keys on upsert sources are rejected before
            try:
                key: Any = json.loads(raw)
            except (ValueError, RecursionError):
                key = raw.decode("utf-8", "replace")
            if isinstance(key, dict) and isinstance(key.get("payload"), dict):
                key = key["payload"]
            row = {c: key.get(c) for c in pk} if isinstance(key, dict) else (
                {pk[0]: key} if len(pk) == 1 else {}
            )
            if any(row.get(c) is None for c in pk):
                errors[i] = (f"tombstone key{self._excerpt(raw)} does not carry the primary "
                             f"key {pk}; use a JSON object of the key columns as the message key")
                continue
            txid, txcount, txend = None, None, False
            if upstream is not None:
                txid, txcount, txend = self._upstream_of(messages[i], None)
                if txid is None:
                    errors[i] = ("tombstone without an upstream transaction id; tombstones have "
                                 "no value, so put the id in a header")
                    continue
            rows.append({**row, SEQ: i, DIFF: 1, DELETE: True, TXID: txid, TXCOUNT: txcount,
                         TXEND: txend})
            kept.append(i)
        try:
            table = pa.Table.from_pylist(rows, schema=self._out_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            table = self._out_schema.empty_table()
            for i, row in zip(kept, rows, strict=True):
                try:
                    table = pa.concat_tables(
                        [table, pa.Table.from_pylist([row], schema=self._out_schema)]
                    )
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                    errors[i] = ("tombstone key does not match the primary key types"
                                 f"{self._excerpt(exc)}")
        return table, errors

    # ---- bad records ---------------------------------------------------------------------

    def bad_record(self, message: Message, seq: int, reason: str) -> BadRecord:
        return BadRecord(
            source=self.spec.name,
            topic=message.topic(),
            partition=message.partition(),
            offset=message.offset(),
            seq=int(seq),
            key=message.key(),
            value=message.value(),
            headers=list(message.headers() or ()),
            error=reason,
        )

    def _with_upstream(self, bad: list[BadRecord]) -> list[BadRecord]:
        """Best effort: the upstream transaction of each bad record, so that a poison record
        still counts towards its transaction's expected count."""
        if self.spec.upstream is None:
            return bad
        return [self._attach(b) for b in bad]

    def _attach(self, bad: BadRecord) -> BadRecord:
        upstream = self.spec.upstream
        assert upstream is not None
        value: Any = None
        in_value = [w for w in (upstream.id, upstream.count, upstream.end)
                    if w is not None and w.field is not None]
        if bad.value is not None and in_value:
            try:
                value = json.loads(bad.value)
            except (ValueError, RecursionError):
                value = None
        txid, txcount, txend = self._upstream_of(bad, value)
        return bad.model_copy(
            update={"upstream_id": txid, "upstream_count": txcount, "upstream_end": txend}
        )

    def _upstream_of(
        self, record: Message | BadRecord, value: Any
    ) -> tuple[str | None, int | None, bool]:
        """Per record (tombstones, bad records): upstream id, expected count, end marker."""
        upstream = self.spec.upstream
        assert upstream is not None
        headers = record.headers if isinstance(record, BadRecord) else (record.headers() or [])

        def read(where: RecordField | None) -> Any:
            if where is None:
                return None
            if where.header is not None:
                found = next((v for k, v in headers if k == where.header), None)
                return None if found is None else found.decode("utf-8", "replace").strip()
            assert where.field is not None
            path = split_path(where.field)
            hit = _walk(value, path)
            if hit is None and self._debezium:
                hit = _walk(value, ("payload", *path))
            return hit

        txid, count, end = read(upstream.id), read(upstream.count), read(upstream.end)
        try:
            count_int = None if count is None else int(count)
        except (TypeError, ValueError):
            count_int = None
        ended = end is True or (isinstance(end, str) and end.lower() in ("true", "1"))
        return (None if txid is None else str(txid)), count_int, ended


# Kafka's default limit of a message is about 1 MB (producer `message.max.bytes`, broker and
# topic `max.message.bytes`); a record can be rejected for its size and still be that large.
MAX_DEAD_LETTER_BYTES = 512 * 1024


@dataclass(frozen=True)
class _Letter:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + sum(
            len(k) + len(v) for k, v in self.headers)

    def within(self, limit: int) -> _Letter:
        """The letter cut to fit in `limit` bytes, the value first, then the record's own
        headers and key; the `txstream.*` headers are kept and say what was cut
        (`txstream.truncated`) and the value's original size (`txstream.value_bytes`)."""
        if self.size() <= limit:
            return self
        value = self.value or b""
        original = dict(self.headers).get("txstream.value_bytes", str(len(value)).encode())
        ours = [(k, v) for k, v in self.headers if k.startswith("txstream.")
                and k not in ("txstream.truncated", "txstream.value_bytes")]
        theirs = [(k, v) for k, v in self.headers if not k.startswith("txstream.")]
        marks = [("txstream.truncated", b"true"), ("txstream.value_bytes", original)]
        cut = _Letter(self.key, value, [*theirs, *ours, *marks])
        if cut.size() - len(value) <= limit:  # the value alone makes room
            return _Letter(self.key, value[:limit - (cut.size() - len(value))], cut.headers)
        key = (self.key or b"")[:max(0, limit - _Letter(None, None, [*ours, *marks]).size())]
        return _Letter(key, b"", [*ours, *marks])


class DeadLetterWriter:
    """Writes bad records to the dead-letter topic: original key, value and headers, plus
    `txstream.*` headers with the source, its coordinates and the error. A value too large for
    the topic is truncated to `max_bytes` in all (headers `txstream.truncated: true` and
    `txstream.value_bytes`: the original size)."""

    def __init__(self, bootstrap_servers: str, topic: str,
                 max_bytes: int = MAX_DEAD_LETTER_BYTES, *,
                 security: KafkaSecurity = PLAINTEXT) -> None:
        self.topic = topic
        self._max_bytes = max_bytes
        self._failed: list[tuple[_Letter, KafkaError]] = []
        self._producer = Producer(client_settings(
            bootstrap_servers, security, **{"enable.idempotence": True, "linger.ms": 20}))

    def _on_delivery(self, letter: _Letter, err: KafkaError | None) -> None:
        if err is not None:
            self._failed.append((letter, err))

    def _produce(self, letter: _Letter) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic, value=letter.value, key=letter.key, headers=letter.headers,
                    on_delivery=lambda err, _msg: self._on_delivery(letter, err),
                )
                break
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.1)
            except KafkaException as exc:
                # Refused before it left (e.g. too large for this producer): kept like a
                # failed delivery, so `flush` raises and sends it again.
                self._failed.append((letter, exc.args[0]))
                break
        self._producer.poll(0)

    def send(self, bad: BadRecord) -> None:
        """Queue one dead letter; never raises: a letter that cannot be delivered is kept and
        makes `flush` fail until it is."""
        headers = [
            *bad.headers,
            ("txstream.error", bad.error.encode()),
            ("txstream.source", bad.source.encode()),
            ("txstream.topic", bad.topic.encode()),
            ("txstream.partition", str(bad.partition).encode()),
            ("txstream.offset", str(bad.offset).encode()),
        ]
        self._produce(_Letter(bad.key, bad.value, headers).within(self._max_bytes))

    def flush(self, timeout: float = 30.0) -> None:
        """Blocks until every dead letter is acknowledged. Raises while any is not, so that the
        consumer offsets past them are not committed; the failed ones are sent again by the next
        call (smaller, when the broker found one too large)."""
        failed, self._failed = self._failed, []
        for letter, err in failed:
            too_large = err.code() == KafkaError.MSG_SIZE_TOO_LARGE
            self._produce(letter.within(letter.size() // 8) if too_large else letter)
        remaining = self._producer.flush(timeout)
        if remaining or self._failed:
            raise KafkaSourceError(
                f"dead-letter topic {self.topic!r}: {remaining} record(s) unacknowledged, "
                f"{len(self._failed)} failed ({', '.join(str(e) for _, e in self._failed[:3])})"
                "; check the topic exists and is writable. They are sent again on the next try"
            )
