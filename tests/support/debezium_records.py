"""Debezium's records as its connectors write them (JsonConverter with schemas): the tutorial's
`inventory.customers` with a TOASTed text column (`CUSTOMERS`, `customer`), the PostgreSQL
connector's change events and keys (`event`, `key`), the ExtractNewRecordState SMT's rows
(`flat`), heartbeats, and an upsert source read poll by poll without a broker (`Source`)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa

from txstream.changes import DIFF, TIME
from txstream.schemas.sources import UNAVAILABLE_VALUE, SourceSpec, UpstreamTransactions
from txstream.schemas.tables import TableSchema
from txstream.sources.debezium.rows import Resolved, resolve
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import SEQ, RawRecords
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


def schemas(name: str, payload: dict[str, Any]) -> bytes:
    """JsonConverter with schemas: the value's schema (its name only) and payload."""
    return json.dumps({"schema": {"type": "struct", "optional": False, "name": name},
                       "payload": payload}).encode()


HEARTBEAT = schemas("io.debezium.connector.common.Heartbeat", {"ts_ms": 1588252618953})
HEARTBEAT_KEY = schemas("io.debezium.connector.common.ServerNameKey",
                        {"serverName": "dbserver1"})


def flat(row: dict[str, Any], deleted: bool | None = None, op: str | None = None,
         schemas: bool = True) -> bytes:
    """The SMT's value: `row` plus `__deleted` (rewrite mode) and `__op`, `__source_ts_ms`
    (add.fields=op,source.ts_ms); with schemas, in the converter's wrapper."""
    value = dict(row)
    if deleted is not None:
        value["__deleted"] = "true" if deleted else "false"
    if op is not None:
        value |= {"__op": op, "__source_ts_ms": 1559033904863}
    if not schemas:
        return json.dumps(value).encode()
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "dbserver1.inventory.customers.Value"},
                       "payload": value}).encode()


def old_key_only(i: int) -> dict[str, Any]:
    """A delete's old row under REPLICA IDENTITY DEFAULT: the key, every other column null."""
    return {"id": i, "first_name": None, "email": None, "notes": None, "photo": None}
