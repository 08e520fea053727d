"""Debezium tombstones and unchanged TOAST values of an upsert source, without a broker: records
written as Debezium's PostgreSQL connector writes them (JsonConverter with schemas) through the
decoder, `debezium.rows.resolve` against the pending changes, and the upsert rows."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa
import pytest

from txstream.changes import DIFF, TIME
from txstream.schemas.sources import UNAVAILABLE_VALUE, SourceSpec, UpstreamTransactions
from txstream.schemas.tables import TableSchema
from txstream.sources.debezium.rows import Resolved, resolve, resolve_updates
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import SEQ, SIGN, RawRecords
from txstream.sources.pending import PendingChanges

# The tutorial's inventory.customers, with a TOASTed text column (PostgreSQL moves values over
# 2 kB out of line) and a bytea read as base64 text.
CUSTOMERS = TableSchema.of({"id": "bigint", "first_name": "text", "email": "text",
                            "notes": "text", "photo": "text"}, primary_key=["id"])
NOTES = "n" * 2400
PHOTO = base64.b64encode(b"\x89PNG" * 700).decode()
TOAST_BYTES = base64.b64encode(UNAVAILABLE_VALUE.encode()).decode()


def customer(i: int, email: str, notes: str = NOTES, photo: str = PHOTO) -> dict[str, Any]:
    return {"id": i, "first_name": "Sally", "email": email, "notes": notes, "photo": photo}


def event(op: str, before: dict | None, after: dict | None, txid: str | None = "780:34131368",
          ) -> bytes:
    """A change event of the PostgreSQL connector (postgresql.adoc, "Data change events"),
    `transaction` as with `provide.transaction.metadata=true`."""
    payload = {
        "before": before, "after": after, "op": op, "ts_ms": 1559033904863,
        "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "dbserver1",
                   "ts_ms": 1559033904863, "snapshot": "false", "db": "postgres",
                   "schema": "inventory", "table": "customers", "txId": 780,
                   "lsn": 34131368, "xmin": None},
        "transaction": None if txid is None else {"id": txid, "total_order": 1,
                                                  "data_collection_order": 1}}
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "dbserver1.inventory.customers.Envelope"},
                       "payload": payload}).encode()


def key(i: int) -> bytes:
    return json.dumps({"schema": {"type": "struct", "fields": [
        {"type": "int64", "optional": False, "field": "id"}]}, "payload": {"id": i}}).encode()


def spec(placeholder: str | None = None) -> SourceSpec:
    return SourceSpec(name="customers", topic="dbserver1.inventory.customers", schema=CUSTOMERS,
                      format="debezium", semantics="upsert",
                      unavailable_value_placeholder=placeholder,
                      upstream=UpstreamTransactions(metadata_topic="dbserver1.transaction",
                                                    data_collection="inventory.customers"))


class Source:
    """One upsert source's decoder and pending changes; each `read` is one poll, every record
    of it in transaction `number`, which `close` applies."""

    def __init__(self, source: SourceSpec) -> None:
        self.spec = source
        self.decoder = SourceDecoder(source)
        self.pending = PendingChanges([source])
        self.seq = 0

    def read(self, records: list[tuple[bytes, bytes | None]], number: int) -> Resolved:
        n = len(records)
        batch = self.decoder.decode(
            RawRecords.of(self.spec.topic, [v for _, v in records], [k for k, _ in records]),
            list(range(self.seq, self.seq + n)))
        assert batch.bad == []
        self.seq += n
        done = resolve(self.spec, batch.rows, batch.tombstones,
                       lambda keys: self.pending.latest(self.spec.name, keys))
        m = done.rows.num_rows
        self.pending.add(self.spec.name, done.rows, pa.array([f"b:{number}"] * m),
                         pa.array([0] * m), done.rows.column(SEQ))
        return done

    def close(self, number: int) -> list[tuple[int, str, str, int]]:
        table = self.pending.take({f"b:{number}": number})[self.spec.name].table
        return sorted((r["id"], r["email"], r["notes"], r[DIFF]) for r in table.to_pylist()
                      if r[TIME] == number)


def test_a_tombstone_after_its_delete_is_skipped_wherever_the_delete_is() -> None:
    """The delete read in the same poll, in an open transaction, or applied already: the
    tombstone changes nothing and joins no transaction."""
    src = Source(spec())
    src.read([(key(i), event("c", None, customer(i, f"{i}@x"))) for i in (1, 2, 3)], 1)
    src.close(1)
    done = src.read([(key(1), event("d", customer(1, "1@x"), None)), (key(1), None)], 2)
    assert done.skipped == [4] and done.rows.num_rows == 1
    src.read([(key(2), event("d", customer(2, "2@x"), None))], 3)
    assert src.read([(key(2), None)], 3).skipped == [6]  # its delete still pending
    assert src.close(2) == [(1, "1@x", NOTES, -1)] and src.close(3) == [(2, "2@x", NOTES, -1)]
    assert src.read([(key(2), None)], 4).skipped == [7]  # its delete applied


def test_a_tombstone_alone_deletes_the_row_it_finds() -> None:
    """Compaction removed the delete event: the tombstone is the deletion (upsert semantics)."""
    src = Source(spec())
    src.read([(key(1), event("c", None, customer(1, "1@x")))], 1)
    src.close(1)
    done = src.read([(key(1), None)], 2)
    assert done.skipped == [] and done.rows.num_rows == 1
    assert src.close(2) == [(1, "1@x", NOTES, -1)]


def test_unchanged_toast_values_keep_the_rows_value() -> None:
    """REPLICA IDENTITY DEFAULT: updates that leave the TOASTed columns alone send the
    placeholder (the text's, and the base64 of its bytes for the bytea), in the same poll as
    the insert, over two updates in a row, and against the applied row."""
    src = Source(spec())
    same = {"notes": UNAVAILABLE_VALUE, "photo": TOAST_BYTES}
    src.read([(key(1), event("c", None, customer(1, "a@x"))),
              (key(1), event("u", None, customer(1, "b@x", **same))),
              (key(1), event("u", None, customer(1, "c@x", **same)))], 1)
    assert src.close(1) == [(1, "c@x", NOTES, 1)]
    done = src.read([(key(1), event("u", None, customer(1, "d@x", **same)))], 2)
    assert done.rows.column("photo").to_pylist() == [PHOTO]
    assert src.close(2) == [(1, "c@x", NOTES, -1), (1, "d@x", NOTES, 1)]


def test_an_unchanged_toast_value_without_a_row_is_rejected() -> None:
    src = Source(spec())
    done = src.read([(key(7), event("u", None, customer(7, "a@x", notes=UNAVAILABLE_VALUE)))], 1)
    assert done.rows.num_rows == 0 and list(done.rejected) == [0]
    assert "['notes']" in done.rejected[0] and "{'id': 7}" in done.rejected[0]


@pytest.mark.parametrize("placeholder", ["__unavailable__", None])
def test_the_placeholder_is_the_connectors(placeholder: str | None) -> None:
    """`unavailable_value_placeholder` as the connector's `unavailable.value.placeholder`:
    only that value (or Debezium's default) stands for an unchanged value."""
    src = Source(spec(placeholder))
    src.read([(key(1), event("c", None, customer(1, "a@x")))], 1)
    src.close(1)
    other = "__unavailable__" if placeholder is None else UNAVAILABLE_VALUE
    src.read([(key(1), event("u", None, customer(1, "b@x", notes=other)))], 2)
    assert src.close(2)[1] == (1, "b@x", other, 1)
    src.read([(key(1), event("u", None, customer(1, "c@x", notes=src.spec.placeholder or "")))],
             3)
    assert src.close(3)[1] == (1, "c@x", other, 1)


def test_an_insert_delete_update_takes_unchanged_values_from_its_before_image() -> None:
    """REPLICA IDENTITY FULL: the old row is complete, the new one has the placeholder; without
    the old value (REPLICA IDENTITY DEFAULT) the change is rejected."""
    source = spec().model_copy(update={"semantics": "insert_delete"})
    old, new = customer(1, "a@x"), customer(1, "b@x", notes=UNAVAILABLE_VALUE)
    batch = SourceDecoder(source).decode(RawRecords.of(source.topic, [
        event("u", old, new), event("u", {**old, "notes": UNAVAILABLE_VALUE}, new)]), [0, 1])
    done = resolve_updates(source, batch.rows)
    assert sorted((r["email"], r["notes"], r[SIGN]) for r in done.rows.to_pylist()) == [
        ("a@x", NOTES, -1), ("b@x", NOTES, 1)]
    assert list(done.rejected) == [1] and "no complete 'before' image" in done.rejected[1]
