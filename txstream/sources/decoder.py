"""The decoder of one source: the raw records one poll read of its topic -> an Arrow table of
rows (vectorized) with bookkeeping columns, every record that cannot be decoded or validated
isolated as a `BadRecord` for the dead-letter topic. It takes plain sequences (`RawRecords`),
no Kafka client objects: the JSON parsing is `txstream.sources.json_values`', the column checks
`txstream.sources.field_checks`', tombstones `txstream.sources.single_records`', the columns taken
from outside the row (upstream transaction, Kafka metadata) `txstream.sources.record_columns`'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.sources import SourceSpec, split_path
from txstream.schemas.tables import ColumnType
from txstream.sources.debezium.events import advice, event_kind
from txstream.sources.field_checks import (
    RecordErrors,
    as_mask,
    base64_decimals,
    braced,
    check_storable,
    iso_dates,
)
from txstream.sources.json_values import DELETED, OP, JsonReader, ParsedJson
from txstream.sources.kafka_source import (
    SEQ,
    BadRecord,
    DecodedBatch,
    RawRecords,
    bookkeeping,
    rows_schema,
)
from txstream.sources.record_columns import metadata_columns, upstream_columns
from txstream.sources.registry.framed import FramedValues, WriterSchemas
from txstream.sources.single_records import tombstone_rows, with_upstream

log = logging.getLogger(__name__)

_DEBEZIUM_OPS = ("c", "r", "u", "d", "t")


def framed_values(value_format: str, schemas: WriterSchemas) -> FramedValues:
    """The reader of a `value_format` in Confluent's wire format."""
    # Each kind's library imported only by the sources that use it.
    if value_format == "avro":
        from txstream.sources.registry.avro import AvroValues

        return AvroValues(schemas)
    if value_format == "json_schema":
        from txstream.sources.registry.json_schema import JsonSchemaValues

        return JsonSchemaValues(schemas)
    if value_format == "protobuf":
        from txstream.sources.registry.protobuf import ProtobufValues

        return ProtobufValues(schemas)
    raise ValueError(f"value_format {value_format!r} is not in Confluent's wire format")


class SourceDecoder:
    """Decodes and validates the records of one source, a whole poll batch at a time."""

    def __init__(self, spec: SourceSpec, schemas: WriterSchemas | None = None,
                 wall_times: bool = False) -> None:
        """`schemas`: the writer schemas of a source whose values are in Confluent's wire
        format (default: its Schema Registry's). `wall_times`: read when each Debezium change
        event happened (`DecodedBatch.wall_ms`), for a pipeline that calls now()."""
        self.spec = spec
        self._schema = spec.table_schema
        self._envelope = spec.format == "debezium"  # before, after and op; else a row
        self._wall_times = wall_times and self._envelope
        self._warned: set[str] = set()  # kinds of Debezium's own records logged
        self._out_schema = rows_schema(spec)
        self._json = JsonReader(spec, wall_times=self._wall_times)
        self._framed: FramedValues | None = None
        if spec.schema_registry_url is not None:  # SourceSpec: exactly the framed formats
            if schemas is None:
                # Imported here: the registry's client is the Kafka client's package, which
                # the decoder's other formats (and its pure tests) do without.
                from txstream.sources.registry.client import RegistrySchemas

                schemas = RegistrySchemas(spec.schema_registry_url)
            self._framed = framed_values(spec.value_format, schemas)

    def _screen(self, records: RawRecords, reject: Callable[[int, str], None],
                rejected: dict[int, str]) -> tuple[list[int], list[bytes], list[int]]:
        """The indices of the records to parse (in order) and their values, and the indices of
        the tombstones; `reject`s the others but the `rejected` ones (already). Whole-batch
        checks pass the records whose value can only be one JSON object; the rest, usually
        none, are looked at one by one."""
        spec = self.spec
        upsert = spec.semantics == "upsert"
        # A Debezium change names its row's key in its value (a truncate has no message key);
        # only its tombstones need the message key.
        keyed = upsert and not spec.debezium
        raw = records.values if isinstance(records.values, list) else list(records.values)
        n = len(raw)
        values = pa.array(raw, pa.binary())
        plain = pc.and_(pc.and_(pc.starts_with(values, b"{"), pc.ends_with(values, b"}")),
                        pc.less_equal(pc.binary_length(values), spec.max_value_bytes))
        fast = as_mask(pc.fill_null(plain, False))
        if keyed:
            fast &= np.fromiter((k is not None for k in records.keys), bool, n)
        fast[list(rejected)] = False
        if fast.all():
            return list(range(n)), raw, []
        candidates = np.flatnonzero(fast).tolist()
        tombstones: list[int] = []
        for i in np.flatnonzero(~fast).tolist():
            value = raw[i]
            if i in rejected:
                continue
            if upsert and records.keys[i] is None and (keyed or value is None):
                reject(i, "null message key on an upsert source: the key identifies the row "
                          "to replace; produce the record with its primary key as the key")
            elif value is None:
                tombstones.append(i)
            elif len(value) > spec.max_value_bytes:
                reject(i, f"value of {len(value)} bytes exceeds max_value_bytes="
                          f"{spec.max_value_bytes} of source {spec.name!r}")
            elif not braced(value):
                reject(i, self._json.explain(value) or "value is not a single JSON object")
            else:
                candidates.append(i)
        candidates.sort()
        return candidates, [raw[i] for i in candidates], tombstones

    def decode(self, records: RawRecords, seqs: Sequence[int]) -> DecodedBatch:
        """The rows of `records` (one topic's, in consumption order; `seqs`: their positions
        in the pipeline's consumption order) and the records that fail."""
        if self._framed is None:
            return self._decode(records, seqs, {})
        transcoded, undecodable = self._framed.transcode(records)
        batch = self._decode(transcoded, seqs, undecodable)
        if batch.bad:  # dead letters hold the original bytes, not their JSON form
            index = {int(s): i for i, s in enumerate(seqs)}
            batch.bad = [b.model_copy(update={"value": records.values[index[b.seq]]})
                         for b in batch.bad]
        return batch

    def _decode(self, records: RawRecords, seqs: Sequence[int], undecodable: dict[int, str]
                ) -> DecodedBatch:
        """`decode` of JSON values, the `undecodable` ones (by index) rejected for their
        reason."""
        spec = self.spec
        bad: list[BadRecord] = []

        def reject(i: int, reason: str) -> None:
            bad.append(self.bad_record(records, i, seqs[i], reason))

        for i, reason in undecodable.items():
            reject(i, reason)
        candidates, values, tombstones = self._screen(records, reject, undecodable)

        parts: list[pa.Table] = []
        parsed, ok, parse_errors = self._json.parse(values)
        for local, reason in parse_errors.items():
            reject(candidates[local], reason)
        good = np.asarray(candidates, dtype=np.int64)[ok]
        wall_ms = np.full(len(records), -1, dtype=np.int64) if self._wall_times else None
        if len(good):
            values_read = ParsedJson(parsed)
            if wall_ms is not None:
                wall_ms[good] = values_read.wall_ms()
            rows, errors = self._rows(values_read, good, records)
            for local, reason in errors.reasons.items():
                reject(int(good[local]), reason)
            parts.append(rows)

        ignored = 0
        skipped: list[int] = []
        kept: list[int] = []
        if tombstones:
            if spec.semantics == "upsert":
                rows, reasons = tombstone_rows(spec, self._out_schema, tombstones, records.keys,
                                               records.headers, self._json.excerpt)
                for i, reason in reasons.items():
                    reject(i, reason)
                parts.append(rows)
                if spec.debezium:
                    kept = [int(seqs[i]) for i in tombstones if i not in reasons]
            elif spec.debezium:
                ignored = len(tombstones)
                skipped = [int(seqs[i]) for i in tombstones]
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
        bad, events = self._not_rows(bad)
        if spec.upstream is not None:
            bad = [with_upstream(spec, b) for b in bad]
        return DecodedBatch(rows=table, bad=bad, ignored_tombstones=ignored,
                            skipped=sorted(skipped + events), tombstones=kept,
                            ignored_events=len(events), wall_ms=wall_ms)

    def _not_rows(self, bad: list[BadRecord]) -> tuple[list[BadRecord], list[int]]:
        """`bad` without Debezium's records that change no row
        (`txstream.sources.debezium.events`), and their consumption positions; logged the first
        time per kind."""
        if not self.spec.debezium:
            return bad, []
        kept: list[BadRecord] = []
        events: list[int] = []
        for record in bad:
            kind = event_kind(record.value)
            if kind is None:
                kept.append(record)
                continue
            events.append(record.seq)
            if kind not in self._warned:
                self._warned.add(kind)
                level = logging.INFO if kind == "logical decoding message" else logging.WARNING
                log.log(level, advice(kind, self.spec.name, record.topic))
        return kept, events

    def _rows(
        self, parsed: ParsedJson, indices: np.ndarray, records: RawRecords
    ) -> tuple[pa.Table, RecordErrors]:
        """The rows of the parsed records (at `indices` of `records`; SEQ holds that index) and
        the errors of the records that fail validation; only rows of valid records are
        returned."""
        spec = self.spec
        n = len(indices)
        errors = RecordErrors(n)
        txid, txcount, txend = upstream_columns(spec, parsed, indices, records, errors)
        meta = metadata_columns(spec, indices, records)
        local = np.arange(n)

        def build(prefix: tuple[str, ...], which: np.ndarray, diff: int | pa.Array,
                  delete: bool, required: list[str], truncate: bool = False
                  ) -> tuple[pa.Table, np.ndarray]:
            cols: dict[str, pa.Array] = {}
            for col in spec.table_schema.names:
                if col in meta:
                    cols[col] = meta[col]
                elif spec.debezium:
                    cols[col] = parsed.envelope((*prefix, *spec.path_of(col)))
                else:
                    cols[col] = parsed.get(spec.path_of(col))
                ctype = self._schema.column(col).type
                if col not in meta and ctype is ColumnType.DATE:
                    cols[col] = iso_dates(cols[col], which, errors, spec.fields.get(col, col))
                elif col not in meta and ctype.is_decimal and spec.precise_decimals:
                    cols[col] = base64_decimals(cols[col], ctype, which, errors,
                                         spec.fields.get(col, col))
                if col not in meta:
                    check_storable(cols[col], which, errors, spec.fields.get(col, col))
            for col in required:
                missing = as_mask(pc.is_null(cols[col])) & which
                where = spec.fields.get(col, col)
                errors.add(missing, f"missing or null required field {where!r} "
                                    f"(column {col!r})")
            diff_arr = pa.array(np.full(n, diff)) if isinstance(diff, int) else diff
            table = pa.table(
                {
                    **cols,
                    **bookkeeping(pa.array(indices), diff_arr, pa.array(np.full(n, delete)),
                                  txid, txcount, txend, pa.array(np.full(n, truncate))),
                },
                schema=self._out_schema,
            )
            return table, which

        required_all = [c.name for c in spec.table_schema.columns if not c.nullable]
        required_keys = list(spec.table_schema.primary_key)
        pieces: list[tuple[pa.Table, np.ndarray]] = []
        if self._envelope:
            op = parsed.envelope(("op",))

            def is_op(*ops: str) -> np.ndarray:
                return as_mask(pc.fill_null(pc.is_in(op, value_set=pa.array(ops)), False))

            def said(i: int) -> str:
                return repr(op[i].as_py())

            errors.add(~is_op(*_DEBEZIUM_OPS), lambda i: f"unknown Debezium op {said(i)}; "
                                                          "expected one of c, r, u, d, t")
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
                # A truncate names no row: it deletes them all when its transaction is applied
                # (`txstream.sources.upsert`).
                pieces.append(build(("before",), is_op("t"), 1, True, [], truncate=True))
            else:
                errors.add(is_op("t"), "Debezium truncate (op 't') on an insert_delete source: "
                           "txstream keeps no rows of it to retract; use semantics 'upsert', or "
                           "let the connector skip truncates (skipped.operations=t, its default)")
                retracts = is_op("u", "d")
                errors.add(retracts & ~has_before, lambda i: f"Debezium op {said(i)} without "
                           "a 'before' row; insert_delete needs full before images (REPLICA "
                           "IDENTITY FULL), or use semantics 'upsert'")
                pieces.append(build(("after",), inserts, 1, False, required_all))
                pieces.append(build(("before",), retracts, -1, False, required_all))
        elif spec.semantics == "insert_delete":
            diff = self._diff_column(parsed, errors)
            pieces.append(build((), local >= 0, diff, False, required_all))
        elif spec.semantics == "upsert" and (spec.delete_field is not None or spec.debezium):
            deletes = self._deletes(parsed)
            pieces.append(build((), ~deletes, 1, False, required_all))
            pieces.append(build((), deletes, 1, True, required_keys))
        else:
            pieces.append(build((), local >= 0, 1, False, required_all))

        valid = ~errors.failed
        kept = [t.filter(pa.array(which & valid)) for t, which in pieces]
        return pa.concat_tables(kept), errors

    def _deletes(self, parsed: ParsedJson) -> np.ndarray:
        """Which records of an upsert source that marks deletes in the row delete their key:
        `delete_field` (JSON), or the flattened form's `__deleted` / `__op` (`json_values`)."""
        if self.spec.delete_field is not None:
            flag = parsed.get(split_path(self.spec.delete_field))
        else:
            flag = pc.or_kleene(pc.equal(parsed.envelope((DELETED,)), "true"),
                                pc.equal(parsed.envelope((OP,)), "d"))
        return as_mask(pc.fill_null(flag, False))

    def _diff_column(self, parsed: ParsedJson, errors: RecordErrors) -> pa.Array:
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
        invalid = as_mask(pc.fill_null(pc.equal(diff, 0), True))
        errors.add(invalid, f"diff field {spec.diff_field!r} is missing or not {expected}")
        return pc.fill_null(diff, 0)

    def bad_record(self, records: RawRecords, index: int, seq: int, reason: str) -> BadRecord:
        """Record `index` of `records`, rejected for `reason`."""
        return BadRecord(
            source=self.spec.name,
            topic=records.topic,
            partition=int(records.partitions[index]),
            offset=int(records.offsets[index]),
            seq=int(seq),
            key=records.keys[index],
            value=records.values[index],
            headers=list(records.headers[index] or ()),
            error=reason,
        )
