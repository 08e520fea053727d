"""JSON values of one source, a whole batch at a time: one `pyarrow.json.read_json` call with
an explicit schema built from the source's fields. When it fails, the batch is bisected so that
only the bad values fall back to single-value parsing (O(bad * log n) parser calls), and the
good values of the batch are kept; a bad value's reason is told in terms of the user's fields.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pydantic import ValidationError

from txstream.schemas.sources import SourceSpec, SourceSpecError, row_model, split_path
from txstream.sources.field_checks import as_mask, json_type

_Tree = dict[str, "pa.DataType | _Tree"]

# Fields Debezium's ExtractNewRecordState SMT adds to a flattened row: `__deleted` ("true" on a
# delete's old row, "false" otherwise) with `delete.handling.mode=rewrite`, `__op` (c, r, u, d)
# with `add.fields=op`. No column is named so: TableSchema refuses names starting with "__".
DELETED, OP = "__deleted", "__op"
# Where a Debezium change event says when it happened, in ms since the epoch: the source
# database's time of the change (its commit, for PostgreSQL), else when the connector read it.
WALL_TIMES = (("source", "ts_ms"), ("ts_ms",))


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


def walk(obj: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` in a parsed JSON object; None where any level is absent."""
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


class ParsedJson:
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

    def wall_ms(self) -> np.ndarray:
        """Debezium: each event's time (`WALL_TIMES`, the first present and positive), -1
        where none. Older connectors wrote `source.ts_ms` 0 for snapshot reads: no time."""
        found = pc.coalesce(*(pc.if_else(pc.greater(times, 0), times, None)
                              for times in (self.envelope(path) for path in WALL_TIMES)))
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)

    def present(self, path: tuple[str, ...]) -> np.ndarray:
        """Debezium: whether the envelope has a non-null struct at `path`."""
        return as_mask(pc.or_(
            pc.is_valid(self.get(("payload", *path))), pc.is_valid(self.get(path))
        ))


class JsonReader:
    """Parses the JSON values of one source into nested Arrow columns (see the module doc)."""

    def __init__(self, spec: SourceSpec, wall_times: bool = False) -> None:
        """`wall_times`: read a Debezium change event's times too (`WALL_TIMES`)."""
        self.spec = spec
        self._schema = spec.table_schema
        self._value_cols = spec.value_columns()
        self._envelope = spec.format == "debezium"  # before, after and op; else the row itself
        self._row_model = row_model(spec.table_schema, self._value_cols, f"{spec.name}_row")
        tree: _Tree = {}
        # Debezium's JsonConverter with schemas wraps each value: {"schema": ..., "payload": ...}
        envelopes: list[tuple[str, ...]] = [(), ("payload",)] if spec.debezium else [()]
        prefixes: list[tuple[str, ...]] = (
            [(*e, part) for e in envelopes for part in ("before", "after")]
            if self._envelope else envelopes
        )
        for prefix in prefixes:
            for col in self._value_cols:
                _tree_insert(tree, prefix + spec.path_of(col),
                             json_type(self._schema.column(col).type, spec.precise_decimals))
        extra: list[tuple[tuple[str, ...], pa.DataType]] = []
        if self._envelope:
            extra.append((("op",), pa.string()))
            extra += [(path, pa.int64()) for path in WALL_TIMES] if wall_times else []
        elif spec.debezium:
            extra += [((DELETED,), pa.string()), ((OP,), pa.string())]
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
            if self._envelope:  # the shape of its transaction ids
                extra.append((("source", "connector"), pa.string()))
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

    def parse(self, values: list[bytes]) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
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
        explained = self.explain(value)
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
            return f"value does not match the schema{self.excerpt(exc)}"
        return "value is not exactly one JSON object"

    def excerpt(self, detail: bytes | Exception) -> str:
        """`detail` (a value, or an error quoting one) for a reason, only with the source's
        `value_excerpts`: reasons are logged."""
        if not self.spec.value_excerpts:
            return ""
        return f" ({detail[:80]!r})" if isinstance(detail, bytes) else f": {detail}"

    def explain(self, value: bytes) -> str | None:
        """The problem of a rejected value found by Python's JSON parser and the row model."""
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError) as exc:
            return f"malformed JSON: {exc}"
        if not isinstance(obj, dict):
            return f"value is a JSON {type(obj).__name__}, not an object"
        body = obj["payload"] if self.spec.debezium and isinstance(obj.get("payload"), dict) \
            else obj
        if self._envelope:
            rows = [(f"{part}.", body.get(part)) for part in ("before", "after")]
        else:
            rows = [("", body)]
        for prefix, row in rows:
            if not isinstance(row, dict):
                continue
            flat = {c: walk(row, self.spec.path_of(c)) for c in self._value_cols}
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
