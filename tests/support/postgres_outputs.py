"""PostgreSQL outputs of a made-up pipeline (a snapshot `totals`, an append `log`) committed
with its progress row, the batches written to them, and the writer leases of one pipeline: for
the tests of the outputs and of their fencing against the real PostgreSQL fixture."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from txstream.changes import Changes
from txstream.schemas.tables import TableSchema
from txstream.sinks.postgres.append import PostgresAppendSink
from txstream.sinks.postgres.outputs import Mark, PostgresOutputs
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink
from txstream.sinks.postgres.writers import Lease, Writer, WritersTable

KEYED = TableSchema.of({"id": "bigint", "v": "bigint"}, primary_key=["id"])
LOG = TableSchema.of({"id": "bigint", "v": "bigint"})


def changes(schema: TableSchema, rows: list[tuple[int, int, int, int]]) -> Changes:
    return Changes.of(pa.Table.from_pylist(
        [{"id": i, "v": v, "time": t, "diff": d} for i, v, t, d in rows],
        schema=schema.arrow_schema(with_changes=True)))


def mark(n: int, upstream: tuple[str, ...] = ()) -> Mark:
    return Mark(n, upstream, {"orders": {0: 10 * n, 1: 5 * n}})


def query(url: str, text: str, db_schema: str, *tables: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql.SQL(text).format(
            *[sql.Identifier(db_schema, t) for t in tables])).fetchall()


def outputs(url: str, db_schema: str, pipeline: str = "p", **options: Any
            ) -> tuple[PostgresOutputs, PostgresSnapshotSink, PostgresAppendSink]:
    snapshot = PostgresSnapshotSink(url, "totals", KEYED, db_schema=db_schema)
    log = PostgresAppendSink(url, "log", LOG, db_schema=db_schema)
    return PostgresOutputs(url, {"totals": [snapshot], "log": [log]}, pipeline=pipeline,
                           definition="txstream.examples.orders:pipeline", db_schema=db_schema,
                           **options), snapshot, log


def batch(first: int, last: int) -> dict[str, Changes]:
    """Transactions first..last: each sets total 1 to its number and logs one row."""
    numbers = range(first, last + 1)
    return {"totals": changes(KEYED, [r for n in numbers
                                      for r in ([(1, n - 1, n, -1)] if n > 1 else [])
                                      + [(1, n, n, 1)]]),
            "log": changes(LOG, [(n, n, n, 1) for n in numbers])}


def writer(host: str, pid: int) -> Writer:
    return Writer(host=host, pid=pid, started_at=datetime(2026, 11, 26, 10, pid % 60, tzinfo=UTC))


def lease(url: str, db_schema: str, host: str, pid: int, lease_s: float = 10.0) -> Lease:
    return Lease(url, WritersTable(db_schema, "p"), writer(host, pid), lease_s=lease_s)


def wait_to_take(standby: Lease, timeout_s: float) -> float:
    """Poll like a standby until it takes the lease; seconds it took."""
    started = time.monotonic()
    while standby.try_take() is None:
        assert time.monotonic() - started < timeout_s, "the standby never took the lease"
        time.sleep(0.1)
    return time.monotonic() - started
