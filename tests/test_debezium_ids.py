"""Debezium transaction ids per connector, without a broker: the one function that reads the
transaction part of an id (`txstream.sources.debezium.ids`), and change events and `END`
events written as each connector writes them, decoded and matched by the transaction
boundaries into exactly one transaction per source transaction, nothing dead-lettered."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.kafka_helpers import ORDERS

from txstream.schemas.sources import BatchPolicy, SourceSpec, SourceSpecError, UpstreamTransactions
from txstream.sources.boundaries import PolledRecords, TopicRule, TransactionBoundaries
from txstream.sources.debezium.ids import transaction_id, transaction_ids
from txstream.sources.debezium.metadata import end_event
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import UPSTREAM_ID, RawRecords
from txstream.sources.source_checks import metadata_connectors

# (connector, BEGIN id, change ids, END id, the transaction), each as the connector writes it,
# from the "Transaction metadata" section of its page of the Debezium documentation
# (https://debezium.io/documentation/reference/stable/connectors/<connector>.html), and its
# source where the page shows no per-event id:
SHAPES = [
    # postgresql.adoc, "Transaction metadata": "the format is `txID:LSN`", BEGIN
    # "571:53195829", END "571:53195832"; the LSN is each event's own (DBZ-5329,
    # PostgresTransactionMonitor, asserted in TransactionMetadataIT): a change in between has
    # its own. The numbers of issue 29's Debezium 2.7 stream.
    ("postgresql", "780:34131152", ["780:34131368", "780:34131400"], "780:34131464", "780"),
    ("postgresql", "571:53195829", ["571:53195832"], "571:53195832", "571"),
    # Debezium 1.x PostgreSQL: the txId alone.
    ("postgresql", "571", ["571"], "571", "571"),
    # mysql.adoc (shared-mariadb-mysql.adoc, trans-meta): the GTID, the same on every event.
    ("mysql", "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10",
     ["0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"], "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10",
     "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"),
    ("mysql", "3E11FA47-71CA-11E1-9E33-C80AA9429562:23",
     ["3E11FA47-71CA-11E1-9E33-C80AA9429562:23"] * 2, "3E11FA47-71CA-11E1-9E33-C80AA9429562:23",
     "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"),
    # MySQL without GTIDs: BinlogOffsetContext.NON_GTID_TRANSACTION_ID_FORMAT "file=%s,pos=%s".
    ("mysql", "file=mysql-bin.000003,pos=154", ["file=mysql-bin.000003,pos=154"],
     "file=mysql-bin.000003,pos=154", "file=mysql-bin.000003,pos=154"),
    # sqlserver.adoc, "Transaction metadata": the commit LSN.
    ("sqlserver", "00000025:00000d08:0025", ["00000025:00000d08:0025"], "00000025:00000d08:0025",
     "00000025:00000d08:0025"),
    # oracle.adoc, "Transaction metadata": the XID.
    ("oracle", "5.6.641", ["5.6.641"], "5.6.641", "5.6.641"),
    # mongodb.adoc, "Transaction metadata" ("1462833718356672513"); since sessions,
    # MongoDbEventMetadataProvider writes `lsid:txnNumber`.
    ("mongodb", "1462833718356672513", ["1462833718356672513"], "1462833718356672513",
     "1462833718356672513"),
    ("mongodb", '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"}}:1',
     ['{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"}}:1'],
     '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"}}:1',
     '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"}}:1'),
]


@pytest.mark.parametrize(("connector", "begin", "changes", "end", "want"), SHAPES)
def test_each_connectors_ids_meet_under_their_transaction(
        connector: str, begin: str, changes: list[str], end: str, want: str) -> None:
    """Told the connector, or reading ids whose connector is not named: BEGIN, every change
    and END give the same transaction."""
    for named in (connector, None):
        assert {transaction_id(i, named) for i in [begin, *changes, end]} == {want}


def test_ids_of_many_changes_are_read_at_once_each_by_its_own_connector() -> None:
    ids = pa.array(["780:34131368", "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10", "12:7", None,
                    "abc:def"])
    by = pa.array(["postgresql", "mysql", None, "postgresql", "postgresql"])
    assert transaction_ids(ids, by).to_pylist() == [
        "780", "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10", "12", None, "abc"]
    # Connectors configured for all: a MySQL id of two numbers would stay whole.
    assert transaction_ids(pa.array(["12:7"]), "mysql").to_pylist() == ["12:7"]


def test_the_connector_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="connector"):
        SourceSpec(name="o", topic="t", schema=ORDERS, format="debezium",
                   semantics="upsert", connector="sybase")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="set format 'debezium'"):
        SourceSpec(name="o", topic="t", schema=ORDERS, connector="mysql")
    specs = [_spec(f"s{i}", connector) for i, connector in enumerate(("mysql", "postgresql"))]
    with pytest.raises(SourceSpecError, match="one connector writes that topic"):
        metadata_connectors(specs)
    assert metadata_connectors([_spec("a", None), _spec("b", "mysql")]) == {"db.transaction":
                                                                          "mysql"}


# ---- changes and END events through the decoder and the boundaries ------------------------


def _spec(name: str, connector: str | None) -> SourceSpec:
    return SourceSpec(
        name=name, topic=f"db.inventory.{name}", schema=ORDERS, format="debezium",
        semantics="upsert", connector=connector,  # type: ignore[arg-type]
        upstream=UpstreamTransactions(metadata_topic="db.transaction",
                                      data_collection=f"inventory.{name}"))


def change(connector: str, txid: str | None, row: dict[str, Any], order: int = 1,
           op: str = "c") -> bytes:
    """A change event as the JsonConverter (schemas enabled) writes it; `source` holds the
    fields of the connector's source block that matter here."""
    tx = None if txid is None else {"id": txid, "total_order": order,
                                    "data_collection_order": order}
    payload = {"before": None, "after": row, "op": op, "ts_ms": 1559033904863,
               "source": {"connector": connector, "name": "dbserver1", "db": "inventory",
                          "table": "orders", "snapshot": "false"},
               "transaction": tx}
    return json.dumps({"schema": {"type": "struct", "name": "dbserver1.inventory.orders.Envelope"},
                       "payload": payload}).encode()


def end_value(txid: str, count: int, collection: str = "inventory.orders") -> bytes:
    return json.dumps({"status": "END", "id": txid, "ts_ms": 1486500577691, "event_count": count,
                       "data_collections": [{"data_collection": collection,
                                             "event_count": count}]}).encode()


def one_transaction_per_source_transaction(connector: str, spec_connector: str | None) -> None:
    spec = _spec("orders", spec_connector)
    # One source transaction per id (PostgreSQL's 1.x and 2.x examples share transaction 571).
    shapes = list({s[4]: s for s in SHAPES if s[0] == connector}.values())
    decoder = SourceDecoder(spec)
    core = TransactionBoundaries(BatchPolicy(max_events=100, max_delay_ms=10_000),
                                 {spec.topic: TopicRule.of(spec)})
    values, want = [], []
    for i, (_, _, ids, _, txn) in enumerate(shapes):
        values += [change(connector, uid, {"id": 10 * i + k, "item": "x", "qty": k}, k + 1)
                   for k, uid in enumerate(ids)]
        want.append(txn)
    batch = decoder.decode(RawRecords.of(spec.topic, values, [b"{}"] * len(values)),
                           list(range(len(values))))
    assert batch.bad == []
    n = len(values)
    polled = PolledRecords.of([spec.topic] * n, [0] * n, np.arange(n),
                              batch.rows.column(UPSTREAM_ID).to_pylist())
    core.consumed(polled.topics, polled.partitions, polled.offsets, {}, 0.0)
    core.place(polled, core.take_seqs(n), 0.0)
    for offset, (_, _, ids, end, _) in enumerate(shapes):
        uid, counts = end_event(end_value(end, len(ids)), spec_connector)
        assert uid is not None
        core.announce(uid, counts["inventory.orders"], ("db.transaction", 0), offset,
                      core.take_seqs(1), 0.0)
    closing = core.close_ready(1.0)
    assert [t.upstream_id for t in closing.transactions] == want
    assert closing.expired == []


@pytest.mark.parametrize("connector", ["postgresql", "mysql", "sqlserver", "oracle", "mongodb"])
def test_connector_ids_close_one_transaction_each(connector: str) -> None:
    """Read from `source.connector`, or configured on the source."""
    one_transaction_per_source_transaction(connector, None)
    one_transaction_per_source_transaction(connector, connector)
