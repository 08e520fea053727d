"""Debezium records that are not a row's change, without a broker: truncates (`op: t`), logical
decoding messages (`op: m`), and heartbeat and schema change records on a source's topic by
mistake; written as the connectors write them (postgresql.adoc "Truncate events" and "Logical
decoding message events", mysql.adoc "Schema change topic", the heartbeat records of
`io.debezium.heartbeat.HeartbeatImpl`)."""

from __future__ import annotations

import json
import logging

import pytest
from support.debezium_records import (
    HEARTBEAT,
    HEARTBEAT_KEY,
    NOTES,
    Source,
    customer,
    event,
    key,
    schemas,
    spec,
)

from txstream.schemas.sources import UNAVAILABLE_VALUE
from txstream.sources.debezium.events import event_kind
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import RawRecords


def truncate(txid: str | None = "781:34132000") -> bytes:
    """postgresql.adoc, "Truncate events": no `before` or `after`, no message key; the
    `transaction` block as with `provide.transaction.metadata=true` (a truncate is a data
    change event of its table, counted in its transaction's END event)."""
    source = json.loads(event("c", None, None))["payload"]["source"]
    payload = {"source": source, "op": "t", "ts_ms": 1559033904961,
               "transaction": None if txid is None else {"id": txid, "total_order": 2,
                                                         "data_collection_order": 2}}
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "dbserver1.inventory.customers.Envelope"},
                       "payload": payload}).encode()


# mysql.adoc, "Schema change topic" (2.x): the DDL of one statement and the tables it changed.
SCHEMA_CHANGE = schemas("io.debezium.connector.mysql.SchemaChangeValue", {
    "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "mysql",
               "ts_ms": 1651535750000, "snapshot": "false", "db": "inventory",
               "table": "customers", "server_id": 223344, "gtid": None,
               "file": "mysql-bin.000003", "pos": 570, "row": 0, "thread": None},
    "ts_ms": 1651535750218, "databaseName": "inventory", "schemaName": None,
    "ddl": "ALTER TABLE customers ADD middle_name varchar(255) AFTER first_name",
    "tableChanges": [{"type": "ALTER", "id": "\"inventory\".\"customers\"",
                      "table": {"defaultCharsetName": "utf8mb4", "primaryKeyColumnNames":
                                ["id"], "columns": []}}]})
SCHEMA_CHANGE_KEY = schemas("io.debezium.connector.mysql.SchemaChangeKey",
                            {"databaseName": "inventory"})
# postgresql.adoc, "Logical decoding message events": a transactional message.
MESSAGE = schemas("io.debezium.connector.postgresql.MessageValue", {
    "op": "m", "ts_ms": 1559033904961,
    "source": json.loads(event("c", None, None))["payload"]["source"],
    "transaction": {"id": "781:34132100", "total_order": 3, "data_collection_order": 1},
    "message": {"prefix": "foo", "content": "Ymfy"}})
MESSAGE_KEY = schemas("io.debezium.connector.postgresql.MessageKey", {"prefix": "foo"})


def test_a_truncate_deletes_every_row_in_its_transaction() -> None:
    """Rows applied before, rows of its own transaction before it (an update of one of them
    nets out), and none inserted after it."""
    src = Source(spec())
    src.read([(key(i), event("c", None, customer(i, f"{i}@x"))) for i in (1, 2, 3)], 1)
    src.close(1)
    src.read([(key(1), event("u", None, customer(1, "1@y"))), (key(4), event("c", None,
              customer(4, "4@x"))), (None, truncate()),
              (key(5), event("c", None, customer(5, "5@x")))], 2)
    assert src.close(2) == [(1, "1@x", NOTES, -1), (2, "2@x", NOTES, -1),
                            (3, "3@x", NOTES, -1), (5, "5@x", NOTES, 1)]
    src.read([(None, truncate()), (None, truncate())], 3)
    assert src.close(3) == [(5, "5@x", NOTES, -1)]
    src.read([(None, truncate())], 4)
    assert src.close(4) == []


def test_after_a_pending_truncate_a_key_has_no_row() -> None:
    """Read before its transaction closes: an unchanged TOAST value after it has nothing to
    take its value from, and a tombstone after it deletes nothing."""
    src = Source(spec())
    src.read([(key(i), event("c", None, customer(i, f"{i}@x"))) for i in (1, 2)], 1)
    src.close(1)
    src.read([(None, truncate())], 2)
    done = src.read([(key(1), event("u", None, customer(1, "1@y", notes=UNAVAILABLE_VALUE))),
                     (key(2), None)], 2)
    assert list(done.rejected) == [3] and "has no row" in done.rejected[3]
    assert done.skipped == [4]
    assert src.close(2) == [(1, "1@x", NOTES, -1), (2, "2@x", NOTES, -1)]


def test_a_truncate_on_an_insert_delete_source_is_dead_lettered_with_the_fix() -> None:
    source = spec().model_copy(update={"semantics": "insert_delete"})
    batch = SourceDecoder(source).decode(RawRecords.of(source.topic, [truncate()]), [0])
    assert batch.rows.num_rows == 0 and len(batch.bad) == 1
    assert "semantics 'upsert'" in batch.bad[0].error
    assert "skipped.operations=t" in batch.bad[0].error
    assert batch.bad[0].upstream_id == "781"  # it still counts towards its transaction


@pytest.mark.parametrize("semantics", ["upsert", "insert_delete"])
def test_heartbeats_schema_changes_and_messages_change_nothing(
        semantics: str, caplog: pytest.LogCaptureFixture) -> None:
    """No rows, no dead letters, no transaction (their positions are skipped); a warning the
    first time a heartbeat or schema change arrives, which says what to fix."""
    source = spec().model_copy(update={"semantics": semantics})
    decoder = SourceDecoder(source)
    values = [HEARTBEAT, b'{"ts_ms": 1588252618953}', SCHEMA_CHANGE, MESSAGE,
              event("c", None, customer(1, "1@x")), b'{"op": "x", "after": {"id": 2}}']
    keys = [HEARTBEAT_KEY, b'{"serverName": "dbserver1"}', SCHEMA_CHANGE_KEY, MESSAGE_KEY,
            key(1), key(2)]
    with caplog.at_level(logging.INFO, logger="txstream.sources.decoder"):
        batch = decoder.decode(RawRecords.of(source.topic, values, keys), list(range(10, 16)))
        decoder.decode(RawRecords.of(source.topic, [HEARTBEAT], [HEARTBEAT_KEY]), [16])
    assert batch.rows.column("id").to_pylist() == [1]
    assert [b.offset for b in batch.bad] == [5] and "unknown Debezium op 'x'" in batch.bad[0].error
    assert batch.skipped == [10, 11, 12, 13] and batch.ignored_events == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # heartbeat and schema change, once each
    assert "heartbeat topic" in warnings[0] and "schema change topic" in warnings[1]


def test_only_debeziums_own_records_are_told_apart() -> None:
    assert event_kind(HEARTBEAT) == "heartbeat"
    assert event_kind(SCHEMA_CHANGE) == "schema change"
    assert event_kind(MESSAGE) == "logical decoding message"
    for other in [None, b"", b"not json", b"[1]", b'{"op": "c", "after": null}',
                  b'{"ts_ms": 1, "id": 2}', b'{"op": "m"}', event("u", None, None)]:
        assert event_kind(other) is None, other
