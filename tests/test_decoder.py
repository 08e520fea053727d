"""The decoder and the pending changes without a broker: records as plain lists (values, keys,
headers) in, rows and bad records out; rows of closing transactions in, one `Changes` per
source out (consolidated, upserts replacing rows)."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kafka_helpers import BAD_OFFSETS, BAD_ORDER, ORDERS

from txstream.changes import DIFF, TIME
from txstream.schemas.sources import RecordField, SourceSpec, UpstreamTransactions
from txstream.schemas.tables import TableSchema
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import (
    DELETE,
    SEQ,
    SIGN,
    TRUNCATE,
    UPSTREAM_COUNT,
    UPSTREAM_ID,
    DecodedBatch,
    Headers,
    RawRecords,
)
from txstream.sources.pending import PendingChanges, originals

Value = dict[str, Any] | bytes | str | None


def _bytes(x: Value) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    return (x if isinstance(x, str) else json.dumps(x)).encode()


def raw(values: list[Value], keys: list[Value] | None = None,
        headers: list[Headers | None] | None = None, topic: str = "t") -> RawRecords:
    return RawRecords.of(topic, [_bytes(v) for v in values],
                         [_bytes(k) for k in keys] if keys is not None else None, headers)


def decode(spec: SourceSpec, values: list[Value], keys: list[Value] | None = None,
           headers: list[Headers | None] | None = None) -> DecodedBatch:
    return SourceDecoder(spec).decode(raw(values, keys, headers, spec.topic),
                                      list(range(len(values))))


def errors(batch: DecodedBatch) -> dict[int, str]:
    """Reasons of the bad records, by offset."""
    return {b.offset: b.error for b in batch.bad}


def own(batch: DecodedBatch, spec: SourceSpec) -> list[dict[str, Any]]:
    return batch.rows.select(spec.table_schema.names).to_pylist()


def transactions(spec: SourceSpec, groups: list[list[tuple[Value, Value]]]
                 ) -> list[list[dict[str, Any]]]:
    """Each group of (key, value) records as one transaction (numbered from 1), through the
    decoder and the pending changes; each transaction's changes, sorted."""
    records = [r for g in groups for r in g]
    decoded = decode(spec, [v for _, v in records], [k for k, _ in records])
    assert not decoded.bad, decoded.bad
    where = [i for i, g in enumerate(groups) for _ in g]
    seqs = decoded.rows[SEQ].to_pylist()
    pending = PendingChanges([spec])
    keys = pa.array([f"b:{where[s]}" for s in seqs], pa.string())
    pending.add(spec.name, decoded.rows, keys, pa.array([0] * len(seqs)), pa.array(seqs))
    changes = pending.take({f"b:{i}": i + 1 for i in range(len(groups))})[spec.name]
    changes.validate()
    table = changes.table
    return [sorted(table.filter(pc.equal(table[TIME], n)).to_pylist(),
                   key=lambda r: (r["id"], r[DIFF]))
            for n in range(1, len(groups) + 1)]


def order_row(i: int) -> dict[str, Any]:
    return {"id": i, "item": f"i{i}", "qty": i}


ORDERS_SPEC = SourceSpec(name="orders", topic="t", schema=ORDERS)
UPSERT = SourceSpec(name="orders", topic="t", schema=ORDERS, semantics="upsert")


# ---- rows and changes ---------------------------------------------------------------------


def test_rows_keep_consumption_order_and_their_bookkeeping() -> None:
    batch = SourceDecoder(ORDERS_SPEC).decode(raw([order_row(1), order_row(2)]), [40, 41])
    assert own(batch, ORDERS_SPEC) == [order_row(1), order_row(2)]
    assert batch.rows[SEQ].to_pylist() == [40, 41] and batch.rows[SIGN].to_pylist() == [1, 1]
    assert batch.rows[UPSTREAM_ID].null_count == 2 and not batch.bad


def test_duplicate_rows_in_one_transaction_are_consolidated() -> None:
    row = ("k", {"id": 1, "item": "a", "qty": 1})
    assert transactions(ORDERS_SPEC, [[row, row, row]]) == [
        [{"id": 1, "item": "a", "qty": 1, TIME: 1, DIFF: 3}]]


def test_upsert_emits_retractions_nets_and_deletes() -> None:
    def row(i: int, item: str, qty: int) -> tuple[Value, Value]:
        return (str(i), {"id": i, "item": item, "qty": qty})

    t1, t2, t3 = transactions(UPSERT, [
        [row(1, "a", 1), row(2, "b", 1), row(1, "a", 2)],
        # update 1, no-op on 2, tombstone 2 (its last record wins), delete of absent key 9.
        [row(1, "a", 5), row(2, "b", 1), (json.dumps({"id": 2}), None), ("9", None),
         row(3, "c", 1)],
        [row(3, "c", 1)],
    ])
    assert t1 == [{"id": 1, "item": "a", "qty": 2, TIME: 1, DIFF: 1},
                  {"id": 2, "item": "b", "qty": 1, TIME: 1, DIFF: 1}]
    assert t2 == [{"id": 1, "item": "a", "qty": 2, TIME: 2, DIFF: -1},
                  {"id": 1, "item": "a", "qty": 5, TIME: 2, DIFF: 1},
                  {"id": 2, "item": "b", "qty": 1, TIME: 2, DIFF: -1},
                  {"id": 3, "item": "c", "qty": 1, TIME: 2, DIFF: 1}]
    assert t3 == [], "an upsert that changes nothing emits nothing"


def test_tombstone_keys_read_times_dates_and_decimals_as_values_do() -> None:
    """A CDC table keyed by a time (prices valid from a time on): its tombstone's key holds the
    time as text, as the row's value does, and deletes the row (the same instant in another
    zone too); a key that is not a time is a bad record saying so."""
    schema = TableSchema.of({"id": "bigint", "since": "timestamp", "day": "date",
                             "cents": "decimal(10,2)", "v": "bigint"},
                            primary_key=["id", "since", "day", "cents"])
    spec = SourceSpec(name="prices", topic="t", schema=schema, semantics="upsert")
    key = {"id": 1, "since": "2026-12-06T12:00:00Z", "day": "2026-12-06", "cents": "1.50"}
    t1, t2 = transactions(spec, [
        [(key, {**key, "v": 7})],
        [({**key, "since": "2026-12-06T13:00:00+01:00", "cents": 1.5}, None)],
    ])
    assert [(r["v"], r[DIFF]) for r in t1] == [(7, 1)] and [(r["v"], r[DIFF]) for r in t2] == [
        (7, -1)]
    assert str(t2[0]["since"]) == "2026-12-06 12:00:00+00:00"
    batch = decode(spec, [None], [{**key, "since": "noon"}])
    assert "does not match the primary key types" in errors(batch)[0]
    wide = SourceSpec(name="wide", topic="t", semantics="upsert", schema=TableSchema.of(
        {"id": "decimal(20,2)", "v": "bigint"}, primary_key=["id"]))
    w1, w2 = transactions(wide, [[('{"id": "123456789012345678.91"}',
                                   {"id": "123456789012345678.91", "v": 1})],
                                 [('{"id": 123456789012345678.91}', None)]])
    assert [r[DIFF] for r in w2] == [-1] and w2[0]["id"] == w1[0]["id"], \
        "a JSON number key keeps every digit of the decimal"


def test_upsert_delete_marker_over_several_transactions() -> None:
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, semantics="upsert",
                      delete_field="deleted")
    assert transactions(spec, [
        [("1", {"id": 1, "item": "a", "qty": 1}), ("1", {"id": 1, "item": "a", "qty": 2})],
        [("1", {"id": 1, "item": "b", "qty": 2}), ("2", {"id": 2, "item": "z", "qty": 0})],
        [("1", {"id": 1, "deleted": True}), ("2", {"id": 2, "item": "z", "qty": 0})],
    ]) == [
        [{"id": 1, "item": "a", "qty": 2, TIME: 1, DIFF: 1}],
        [{"id": 1, "item": "a", "qty": 2, TIME: 2, DIFF: -1},
         {"id": 1, "item": "b", "qty": 2, TIME: 2, DIFF: 1},
         {"id": 2, "item": "z", "qty": 0, TIME: 2, DIFF: 1}],
        [{"id": 1, "item": "b", "qty": 2, TIME: 3, DIFF: -1}],
    ]


def test_rows_of_a_dropped_transaction_become_dead_letters() -> None:
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, semantics="insert_delete")
    decoded = decode(spec, [{**order_row(1), "diff": -1}, {**order_row(2), "diff": 1}])
    pending = PendingChanges([spec])
    pending.add("orders", decoded.rows, pa.array(["u:X", "u:Y"]), pa.array([0, 0]),
                pa.array([7, 8]))
    (letter,) = pending.drop("u:X", "X", "gone")
    assert (letter.offset, letter.upstream_id, letter.error) == (7, "X", "gone")
    assert json.loads(letter.value or b"") == {**order_row(1), DIFF: -1}
    assert pending.take({"u:Y": 1})["orders"].table[TIME].to_pylist() == [1]


def test_a_dropped_transaction_dead_letters_its_original_records_byte_for_byte() -> None:
    """Kept with the rows (`originals`): each record once, an update's two rows too, its key,
    value and headers as read, whitespace and all."""
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, format="debezium",
                      semantics="insert_delete")
    values = [json.dumps(_debezium("u", order_row(1), {**order_row(1), "qty": 2}, False)) + " ",
              json.dumps(_debezium("c", None, order_row(2), True))]
    keys, headers = ['{"id": 1}', b'{"id":2}'], [[("h", b"\x00\xff"), ("n", b"")], None]
    records = raw(values, keys, headers)  # type: ignore[arg-type]
    decoded = SourceDecoder(spec).decode(records, [0, 1])
    seqs = decoded.rows[SEQ].to_pylist()
    pending = PendingChanges([spec])
    pending.add("orders", decoded.rows, pa.array(["u:X"] * len(seqs)), pa.array([0] * len(seqs)),
                pa.array(seqs), originals(records, seqs))
    letters = pending.drop("u:X", "X", "gone")
    assert [(b.offset, b.key, b.value, b.headers) for b in letters] == [
        (0, b'{"id": 1}', values[0].encode(), [("h", b"\x00\xff"), ("n", b"")]),
        (1, b'{"id":2}', values[1].encode(), [])]


# ---- bad input ----------------------------------------------------------------------------


def test_bad_records_are_isolated_with_their_reasons() -> None:
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, semantics="upsert",
                      max_value_bytes=200)
    records = BAD_ORDER
    batch = decode(spec, [v for _, v in records], [k for k, _ in records])
    assert own(batch, spec) == [{"id": i, "item": "ok", "qty": i} for i in range(5)]
    reasons = errors(batch)
    assert sorted(reasons) == BAD_OFFSETS
    assert "malformed JSON" in reasons[1]
    assert reasons[2].startswith("field 'qty': Input should be a valid int")
    assert "'id'" in reasons[3] and "max_value_bytes" in reasons[4]
    assert "null message key" in reasons[7]
    assert "less than or equal to 2147483647" in reasons[8]
    assert "not an object" in reasons[9]
    by_offset = {b.offset: b for b in batch.bad}
    assert by_offset[1].value == b'{"id": 10, "item": "x", "qty": ' and by_offset[1].key == b"10"
    assert all(b.topic == "t" and b.source == "orders" for b in batch.bad)


GARBAGE = [b"[" * 100_000, b"\xff\xfe{", b'{"id": 1}\n{"id": 2}', b"null", b'"text"',
           b'{"id": {"nested": 1}}', b'{"id": 1e400}', b'{"id": -9223372036854775809}',
           b' {"id": 3, "item": "x", "qty": 3}\r\n', b'{"id": 4, "item": "y", "qty": 4}']


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(GARBAGE), st.binary(max_size=40),
                          st.builds(lambda i: json.dumps(order_row(i)).encode(),
                                    st.integers(0, 50))), max_size=25))
def test_a_batch_decodes_as_its_records_one_by_one(values: list[bytes]) -> None:
    """Whatever the garbage, every record is a row or a bad record, and the batch (parsed
    whole, then bisected around bad values) agrees with decoding each record alone."""
    decoder = SourceDecoder(UPSERT)
    keys: list[Value] = [str(i) for i in range(len(values))]
    batch = decoder.decode(raw(list(values), keys), list(range(len(values))))
    assert batch.rows.num_rows + len(batch.bad) == len(values)
    alone_rows: list[dict[str, Any]] = []
    alone_bad: dict[int, str] = {}
    for i, value in enumerate(values):
        single = decoder.decode(raw([value], [keys[i]]), [i])
        alone_rows += single.rows.to_pylist()
        alone_bad.update((i, b.error) for b in single.bad)
    assert batch.rows.to_pylist() == alone_rows
    assert {b.seq: b.error for b in batch.bad} == alone_bad


def test_values_padded_with_whitespace_are_read_in_their_place() -> None:
    padded = [b" \t", b"\r\n ", b"\n"]
    values: list[Value] = [padded[i % 3] + json.dumps(order_row(i)).encode() + padded[i % 2]
                           if i % 3 else order_row(i) for i in range(12)]
    batch = decode(UPSERT, [*values, b" null "], [str(i) for i in range(13)])
    assert own(batch, UPSERT) == [order_row(i) for i in range(12)]
    assert list(errors(batch)) == [12]


@pytest.mark.parametrize("semantics", ["upsert", "insert_delete"])
def test_key_columns_are_required_whatever_the_schema_says(semantics: str) -> None:
    # As a YAML schema declares it: every column nullable by default, the key too.
    schema = TableSchema.model_validate({
        "columns": [{"name": "id", "type": "bigint"}, {"name": "item", "type": "text"},
                    {"name": "qty", "type": "int"}],
        "primary_key": ["id"]})
    spec = SourceSpec(name="orders", topic="t", schema=schema, semantics=semantics)
    assert not spec.table_schema.column("id").nullable
    extra = {"diff": 1} if semantics == "insert_delete" else {}
    batch = decode(spec, [{"id": 1, "item": "a", "qty": 1, **extra},
                          {"item": "no key", "qty": 2, **extra},
                          {"id": None, "item": "null key", "qty": 3, **extra},
                          {"id": 4, "item": "d", "qty": 4, **extra}], ["1", "2", "3", "4"])
    assert [r["id"] for r in own(batch, spec)] == [1, 4]
    assert list(errors(batch)) == [1, 2]
    assert all("required field 'id'" in e for e in errors(batch).values())


def test_values_no_sink_can_store_are_rejected() -> None:
    schema = TableSchema.of({"id": "bigint", "name": "text", "day": "date", "at": "timestamp"})
    spec = SourceSpec(name="typed", topic="t", schema=schema)
    batch = decode(spec, [
        {"id": 1, "name": "fine", "day": "0001-01-01", "at": "9999-12-31T23:59:59Z"},
        {"id": 2, "name": "nul\u0000inside"},
        {"id": 3, "day": "0000-01-01"},
        {"id": 4, "at": "0000-06-01T00:00:00Z"},
    ])
    assert [r["id"] for r in own(batch, spec)] == [1]
    reasons = errors(batch)
    assert "'name'" in reasons[1] and "NUL" in reasons[1]
    assert "'day'" in reasons[2] and "year 1 to 9999" in reasons[2]
    assert "'at'" in reasons[3] and "year 1 to 9999" in reasons[3]


# ---- formats: nested paths, metadata, insert_delete, Debezium, types ----------------------


def test_nested_paths_and_metadata_columns() -> None:
    schema = TableSchema.of({"id": "bigint", "city": "text", "k": "text", "off": "bigint",
                             "part": "int", "ts": "timestamp", "hdr": "text", "src": "text"})
    spec = SourceSpec(name="people", topic="p", schema=schema, fields={"city": "address.city"},
                      metadata={"k": "key", "off": "offset", "part": "partition",
                                "ts": "timestamp", "hdr": "headers", "src": "topic"})
    records = RawRecords(
        topic="p", partitions=[3, 3], offsets=[70, 71],
        values=[_bytes({"id": 1, "address": {"city": "Oslo", "zip": "0150"}}),
                _bytes({"id": 2, "address": None})],
        keys=[b"k1", None], headers=[[("trace", b"abc")], None],
        timestamps=[(1, 1_700_000_000_000), (0, 0)])
    r1, r2 = SourceDecoder(spec).decode(records, [0, 1]).rows.to_pylist()
    assert (r1["city"], r1["k"], r1["off"], r1["part"], r1["src"]) == ("Oslo", "k1", 70, 3, "p")
    assert json.loads(r1["hdr"]) == {"trace": "abc"} and r1["ts"].year == 2023
    assert (r2["city"], r2["k"], r2["off"], r2["ts"]) == (None, None, 71, None)


def test_insert_delete_integer_and_named_diffs() -> None:
    numeric = SourceSpec(name="numeric", topic="t", schema=ORDERS, semantics="insert_delete")
    batch = decode(numeric, [{**order_row(1), "diff": 1}, {**order_row(2), "diff": -1},
                             {**order_row(3), "diff": 0}, order_row(4)])
    assert batch.rows[SIGN].to_pylist() == [1, -1] and sorted(errors(batch)) == [2, 3]
    named = SourceSpec(name="named", topic="t", schema=ORDERS, semantics="insert_delete",
                       diff_field="meta.op", diff_values={"insert": 1, "delete": -1})
    batch = decode(named, [{**order_row(7), "meta": {"op": "delete"}},
                           {**order_row(8), "meta": {"op": "upsert"}}])
    assert batch.rows[SIGN].to_pylist() == [-1] and list(errors(batch)) == [1]
    assert "one of ['delete', 'insert']" in errors(batch)[1]


def _debezium(op: str, before: dict | None, after: dict | None, wrapped: bool) -> dict:
    envelope = {"op": op, "before": before, "after": after, "source": {"lsn": 1}}
    return {"schema": {"type": "struct"}, "payload": envelope} if wrapped else envelope


def test_debezium_events_say_when_they_happened() -> None:
    """A transaction's wall time, per event: the source database's `source.ts_ms`, else the
    envelope's `ts_ms` (when the connector read it), else none (-1: the Kafka timestamp then);
    wrapped in a `payload` or not; 0 is no time; a tombstone says none."""
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, format="debezium",
                      semantics="upsert")
    both = {**_debezium("c", None, order_row(1), wrapped=False), "ts_ms": 20}
    both["source"] = {**both["source"], "ts_ms": 10}
    connector = _debezium("c", None, order_row(2), wrapped=True)
    connector["payload"]["ts_ms"] = 30
    connector["payload"]["source"]["ts_ms"] = 0  # older connectors' snapshot reads: no time
    records = raw([both, connector, _debezium("c", None, order_row(3), wrapped=False), None],
                  ['{"id": 1}', '{"id": 2}', '{"id": 3}', '{"id": 4}'])
    batch = SourceDecoder(spec, wall_times=True).decode(records, [0, 1, 2, 3])
    assert batch.wall_ms is not None and batch.wall_ms.tolist() == [10, 30, -1, -1]
    assert SourceDecoder(spec).decode(records, [0, 1, 2, 3]).wall_ms is None, \
        "read only for a pipeline that calls now()"
    assert SourceDecoder(UPSERT, wall_times=True).decode(
        raw([order_row(1)], ["1"]), [0]).wall_ms is None


@pytest.mark.parametrize("semantics", ["insert_delete", "upsert"])
def test_debezium_create_update_delete_snapshot(semantics: str) -> None:
    spec = SourceSpec(name="orders", topic="t", schema=ORDERS, format="debezium",
                      semantics=semantics)
    a1, a2, c3 = order_row(1), {**order_row(1), "qty": 2}, order_row(3)
    batch = decode(spec, [
        _debezium("r", None, a1, wrapped=True), _debezium("c", None, c3, wrapped=False),
        _debezium("u", a1, a2, wrapped=False), _debezium("d", c3, None, wrapped=True),
        None,  # Debezium's tombstone after a delete
        _debezium("t", None, None, wrapped=False),  # truncate (no message key in Debezium)
    ], ['{"id": 1}', '{"id": 3}', '{"id": 1}', '{"id": 3}', '{"id": 3}', None])
    got = sorted((r[SEQ], r["qty"] or 0, r[SIGN], r[DELETE], r[TRUNCATE])
                 for r in batch.rows.to_pylist())
    if semantics == "insert_delete":
        assert "truncate (op 't') on an insert_delete source" in errors(batch)[5]
        assert got == [(0, 1, 1, False, False), (1, 3, 1, False, False),
                       (2, 1, -1, False, False), (2, 2, 1, False, False),
                       (3, 3, -1, False, False)]
        assert batch.ignored_tombstones == 1 and len(batch.bad) == 1
    else:
        # The 'd' event deletes by its 'before' image, the tombstone by its key alone (qty
        # null, shown as 0): deleting an absent key again changes nothing downstream. The
        # truncate names no key: it deletes every row when its transaction is applied.
        assert got == [(0, 1, 1, False, False), (1, 3, 1, False, False),
                       (2, 2, 1, False, False), (3, 3, 1, True, False),
                       (4, 0, 1, True, False), (5, 0, 1, True, True)]
        assert batch.bad == []


def test_column_types_dates_timestamps_booleans() -> None:
    schema = TableSchema.of({"id": "bigint", "day": "date", "at": "timestamp", "ok": "boolean",
                             "price": "double"})
    spec = SourceSpec(name="typed", topic="t", schema=schema)
    batch = decode(spec, [
        {"id": 1, "day": "2024-02-29", "at": "2024-02-29T10:00:00+01:00", "ok": True,
         "price": 2},
        {"id": 2, "day": "2024-02-30"},  # not a date
        {"id": 3, "day": 19000},  # a number where a date is due
        {"id": 4, "ok": "yes"},  # not a boolean
    ])
    (row,) = own(batch, spec)
    assert str(row["day"]) == "2024-02-29" and row["at"].isoformat() == "2024-02-29T09:00:00+00:00"
    assert row["ok"] is True and row["price"] == 2.0
    reasons = errors(batch)
    assert "not a date" in reasons[1] and "day" in reasons[2] and "ok" in reasons[3]


def test_decimals_are_read_from_their_json_text() -> None:
    spec = SourceSpec(name="money", topic="t",
                      schema=TableSchema.of({"id": "bigint", "amount": "decimal(19,2)"}))
    batch = decode(spec, [
        '{"id": 1, "amount": 12345678901234567.89}',  # more digits than a double has
        '{"id": 2, "amount": "-0.10"}', '{"id": 3, "amount": 5}',
        '{"id": 4, "amount": 0.125}',  # three places: not a decimal(19,2)
        '{"id": 5, "amount": "ten"}',
    ])
    assert batch.rows["amount"].to_pylist() == [
        Decimal("12345678901234567.89"), Decimal("-0.10"), Decimal("5.00")]
    reasons = errors(batch)
    assert "'amount'" in reasons[3] and "2 decimal places" in reasons[3]
    assert "'amount'" in reasons[4] and "decimal" in reasons[4]


@pytest.mark.parametrize("mode", ["precise", "string"])
def test_debezium_decimal_encodings(mode: str) -> None:
    schema = TableSchema.of({"id": "bigint", "amount": "decimal(12,2)"}, primary_key=["id"])
    # Debezium's default is `precise`: the setting left out means it.
    spec = SourceSpec(name="orders", topic="t", schema=schema, format="debezium",
                      semantics="upsert",
                      **({"decimal_handling_mode": mode} if mode != "precise" else {}))
    # 429.04 and -0.01: unscaled 42904 = 0x00A798 and -1 = 0xFF, as Kafka Connect writes them.
    good = ["AKeY", "/w=="] if mode == "precise" else ["429.04", "-0.01"]
    batch = decode(spec, [
        _debezium("c", None, {"id": 1, "amount": good[0]}, wrapped=True),
        _debezium("c", None, {"id": 2, "amount": good[1]}, wrapped=False),
        _debezium("c", None, {"id": 3, "amount": "AKeY!"}, wrapped=False),
    ], ['{"id": 1}', '{"id": 2}', '{"id": 3}'])
    assert batch.rows["amount"].to_pylist() == [Decimal("429.04"), Decimal("-0.01")]
    (reason,) = errors(batch).values()
    assert "amount'" in reason and (mode != "precise" or "decimal_handling_mode" in reason)


# ---- upstream transactions ------------------------------------------------------------------


def test_upstream_ids_counts_and_ends_from_headers_and_fields() -> None:
    counted = SourceSpec(name="orders", topic="t", schema=ORDERS, upstream=UpstreamTransactions(
        id=RecordField(header="txid"), count=RecordField(header="txn")))
    batch = decode(counted, [order_row(1), b'{"id": 2, "item": ', order_row(3), order_row(4)],
                   headers=[[("txid", b"P"), ("txn", b"3")], [("txid", b"P"), ("txn", b"3")],
                            [("txid", b"P"), ("txn", b" 3 ")], [("txid", b"C"), ("txn", b"lots")]])
    assert batch.rows[UPSTREAM_ID].to_pylist() == ["P", "P"]
    assert batch.rows[UPSTREAM_COUNT].to_pylist() == [3, 3]
    poison, unreadable = batch.bad
    assert (poison.upstream_id, poison.upstream_count) == ("P", 3), "it still counts"
    assert "no positive upstream record count" in unreadable.error
    marked = SourceSpec(name="orders", topic="t", schema=ORDERS, upstream=UpstreamTransactions(
        id=RecordField(field="tx"), id_type="bigint", end=RecordField(field="last")))
    batch = decode(marked, [{**order_row(1), "tx": 7}, {**order_row(2), "tx": 7, "last": True},
                            order_row(3)])
    assert [(r[UPSTREAM_ID], r["__upstream_end"]) for r in batch.rows.to_pylist()] == \
        [("7", False), ("7", True)]
    assert "no upstream transaction id (field 'tx')" in errors(batch)[2]


def test_garbage_of_every_byte_is_accounted_for() -> None:
    rng = random.Random(4)
    garbage = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(30)]
    values: list[Value] = [*(order_row(i) for i in range(10)), *garbage,
                           *(order_row(i) for i in range(10, 20))]
    batch = decode(UPSERT, values, [str(i) for i in range(len(values))])
    assert own(batch, UPSERT) == [order_row(i) for i in range(20)]
    assert len(batch.bad) == len(garbage)
