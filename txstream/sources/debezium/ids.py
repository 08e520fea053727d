"""The transaction part of the ids Debezium connectors write, so that a change, its
transaction's `BEGIN` and its `END` event meet under one id. Pure: Arrow arrays in and out.

What each connector writes in `transaction.id` and in the `id` of its `BEGIN`/`END` events (the
connector's "Transaction metadata" section of the Debezium documentation):

* PostgreSQL, since Debezium 2.0 (DBZ-5329): `txId:LSN`, the LSN being the position of each
  event, so that `BEGIN`, every change and `END` of one transaction differ after the colon
  (`780:34131152`, `780:34131368`, `780:34131464`). The transaction is the `txId` before the
  colon; before 2.0 the id was the `txId` alone.
* MySQL and MariaDB: the GTID (`0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10`), or without GTIDs
  `file=<binlog file>,pos=<position>`; SQL Server: the commit LSN
  (`00000025:00000d08:0025`); Oracle: the XID (`5.6.641`); MongoDB: `lsid:txnNumber`; Db2:
  the commit LSN. Each is the same on `BEGIN`, the changes and `END`: kept whole (a GTID's or
  an LSN's colons are part of it).
* A connector not named (neither configured nor in the change's `source.connector`): an id of
  two decimal numbers joined by a colon is PostgreSQL's shape, which no other connector writes,
  and loses its LSN; any other id is kept whole.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.sources import DebeziumConnector

KNOWN: tuple[DebeziumConnector, ...] = ("postgresql", "mysql", "mariadb", "sqlserver", "oracle",
                                        "mongodb", "db2")
_BEFORE_COLON = r"^([^:]*):.*$"
_POSTGRES_SHAPE = r"^([0-9]+):[0-9]+$"


def transaction_ids(ids: pa.Array, connectors: pa.Array | str | None) -> pa.Array:
    """The transaction of each Debezium id in `ids` (null stays null), read by its connector:
    one for all (`connectors` a name, or None when unknown) or one per id (an array of
    `source.connector` values, null where a change does not say). See the module doc."""
    ids = ids.cast(pa.string())
    if connectors is None or isinstance(connectors, str):
        connectors = pa.array([connectors] * len(ids), pa.string())

    def said(names: list[str]) -> pa.Array:
        return pc.fill_null(pc.is_in(connectors, value_set=pa.array(names, pa.string())), False)

    by_shape = pc.replace_substring_regex(ids, _POSTGRES_SHAPE, r"\1")
    kept_whole = pc.if_else(said([c for c in KNOWN if c != "postgresql"]), ids, by_shape)
    return pc.if_else(said(["postgresql"]), pc.replace_substring_regex(ids, _BEFORE_COLON, r"\1"),
                      kept_whole)


def transaction_id(uid: str, connector: str | None) -> str:
    """`transaction_ids` of one id."""
    return str(transaction_ids(pa.array([uid], pa.string()), connector)[0].as_py())
