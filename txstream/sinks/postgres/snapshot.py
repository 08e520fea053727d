"""Live snapshot of a keyed output table in PostgreSQL, correct under out-of-order delivery.

Each key's row carries the `time` and `diff` of the last change applied to it (when the engine
computed a batch as one transaction, `PipelineConfig.nets_batches`, that is the batch's last
transaction, and no change within the batch is seen apart). A batch is applied
in one PostgreSQL transaction: the last change per key is COPied into a temporary table, then one
`INSERT ... ON CONFLICT DO UPDATE ... WHERE` replaces a row only with a newer change. Deletions
stay as tombstones (`diff = -1`), so an older insertion delivered later (a replay after a crash,
another writer, a change topic read across partitions) cannot resurrect the row; the stored row
of a key is always its greatest `(time, diff)` change, whatever the order of delivery. Within one
time a +1 beats a -1 because an update is `-1 old, +1 new` in one transaction.

A key may be null (a group-by key, a distinct row): see `ensure_table`. A row PostgreSQL refuses
is kept in the rejects table and the rest of the batch is written
(`txstream.sinks.postgres.rejects`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Literal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.sinks import RetryPolicy, TombstonePurge
from txstream.schemas.tables import TableSchema
from txstream.sinks.conform import conform_changes
from txstream.sinks.postgres.common import (
    Connection,
    check_identifier,
    copy_into,
    ensure_table,
    max_time,
)
from txstream.sinks.postgres.rejects import (
    apply_isolating,
    ensure_rejects_table,
    forget_rejects,
    record_rejects,
)
from txstream.sinks.sink import SinkBase, SinkSchemaError
from txstream.updates import same_values

log = logging.getLogger(__name__)


def last_change_per_key(changes: pa.Table, key: list[str]) -> pa.Table:
    """One change per key (null and NaN key values are values like any other): the greatest
    `(time, diff)`, sorted by key.

    Sorting by key also makes concurrent writers lock rows in the same order.
    """
    order = [(k, "ascending") for k in key] + [(TIME, "descending"), (DIFF, "descending")]
    ordered = changes.take(pc.sort_indices(changes, sort_keys=order))
    if ordered.num_rows < 2:
        return ordered
    # A row starts a new key when any key column differs from the row before it.
    same: pa.ChunkedArray | None = None
    for name in key:
        column = ordered[name]
        equal = same_values(column.slice(1), column.slice(0, ordered.num_rows - 1))
        same = equal if same is None else pc.and_(same, equal)
    assert same is not None  # a keyed table has at least one key column
    return ordered.filter(pa.chunked_array([pa.array([True]), *pc.invert(same).chunks]))


class PostgresSnapshotSink(SinkBase):
    """The live snapshot of one keyed output table in `db_schema.table`.

    `mode="create"` creates the table if missing and validates an existing one; `"replace"`
    drops and recreates it. The view `live_view` (default `<table>_live`) shows the live rows
    without `time` and `diff`. With `purge`, a background thread purges tombstones below the
    watermark declared through `advance_watermark`.
    """

    def __init__(self, url: str, table: str, schema: TableSchema, *, db_schema: str = "public",
                 mode: Literal["create", "replace"] = "create", live_view: str | None = None,
                 retry: RetryPolicy | None = None, purge: TombstonePurge | None = None) -> None:
        if not schema.primary_key:
            raise SinkSchemaError(
                f"table {table!r} has no primary key: a live snapshot keeps one row per key. "
                "Declare a primary key or use an append sink"
            )
        if mode not in ("create", "replace"):
            raise SinkSchemaError(f"mode must be 'create' or 'replace', not {mode!r}")
        self.schema = schema
        self._key = list(schema.primary_key)
        self._db_schema = check_identifier(db_schema, "database schema")
        self._table_name = check_identifier(table, "table")
        view = check_identifier(live_view if live_view is not None else f"{table}_live",
                                "live view (pass live_view=... to choose a shorter one)")
        self.table = sql.Identifier(self._db_schema, self._table_name)
        self.view = sql.Identifier(self._db_schema, view)
        # One per table: sinks sharing a connection (one transaction) stage side by side.
        digest = hashlib.sha1(f"{self._db_schema}.{self._table_name}".encode()).hexdigest()[:16]
        self._stage = sql.Identifier("pg_temp", f"txstream_stage_{digest}")
        self._retry = retry or RetryPolicy()
        self._url = url
        self._db = Connection(url, self._retry, f"txstream snapshot {table}")
        self._upsert = self._upsert_statement()
        try:
            self._db.run(lambda conn: self._set_up(conn, replace=mode == "replace"))
        except BaseException:
            self._db.close()
            raise
        self._watermark: int | None = None
        self._purge = purge
        self._stop = threading.Event()
        self._purger: threading.Thread | None = None
        if purge is not None:
            self._purger = threading.Thread(
                target=self._purge_loop, name=f"purge-{table}", daemon=True)
            self._purger.start()

    def _set_up(self, conn: psycopg.Connection[tuple[object, ...]], *, replace: bool) -> None:
        ensure_table(conn, self._db_schema, self._table_name, self.schema, diff_type="SMALLINT",
                     key=self.schema.primary_key, replace=replace)
        ensure_rejects_table(conn, self._db_schema)
        if replace:
            forget_rejects(conn, self._db_schema, self._table_name)
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in self.schema.names)
        try:
            with conn.transaction():
                conn.execute(sql.SQL('CREATE OR REPLACE VIEW {} AS SELECT {} FROM {}'
                                     ' WHERE "diff" = 1').format(self.view, columns, self.table))
        except (psycopg.errors.WrongObjectType, psycopg.errors.InvalidTableDefinition) as exc:
            raise SinkSchemaError(
                f"cannot create the live view {self.view.as_string()}: {exc.diag.message_primary}."
                " Drop that relation or choose another live_view name"
            ) from exc

    def held_through(self) -> int | None:
        return self._db.run(lambda conn: max_time(conn, self.table))

    def written_through(self, conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
        return None  # the time guard makes a replay change nothing

    def _upsert_statement(self) -> sql.Composed:
        names = self.schema.arrow_schema(with_changes=True).names
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        updates = sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
            for n in names if n not in self._key
        )
        return sql.SQL(
            "INSERT INTO {table} AS t ({columns}) SELECT {columns} FROM {stage}"
            " ON CONFLICT ({key}) DO UPDATE SET {updates}"
            ' WHERE t."time" < EXCLUDED."time"'
            ' OR (t."time" = EXCLUDED."time" AND t."diff" < EXCLUDED."diff")'
        ).format(table=self.table, columns=columns, stage=self._stage, updates=updates,
                 key=sql.SQL(", ").join(sql.Identifier(k) for k in self._key))

    def write(self, changes: Changes) -> None:
        """Apply `changes` atomically;
        rows PostgreSQL refuses go to the rejects table in the same transaction."""
        self.rejected_rows += self._db.run(lambda conn: self.apply(conn, changes))

    def apply(self, conn: psycopg.Connection[tuple[object, ...]], changes: Changes) -> int:
        """`write`, in the caller's transaction (see `txstream.sinks.postgres.outputs`); the number
        of rows refused."""
        conformed = conform_changes(changes, self.schema, by_key=True)
        if not conformed.num_rows:
            return 0
        batch = last_change_per_key(conformed.table, self._key)

        def upsert(conn: psycopg.Connection[tuple[object, ...]], rows: pa.Table) -> None:
            with conn.cursor() as cur:
                copy_into(cur, self._stage, rows)
                cur.execute(self._upsert)
                cur.execute(sql.SQL("TRUNCATE {}").format(self._stage))

        conn.execute(sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS"
        ).format(self._stage, self.table))
        rejects = apply_isolating(conn, batch, upsert)
        record_rejects(conn, self._db_schema, self._table_name, rejects)
        return rejects.count

    def advance_watermark(self, time: int) -> None:
        """Declare that no change with `time` <= this will ever be written to this table again
        (by any writer), e.g. the last checkpointed transaction: tombstones up to it may go."""
        if self._watermark is None or time > self._watermark:
            self._watermark = time

    def on_checkpoint(self, transaction: int) -> None:
        self.advance_watermark(transaction)

    def purge_tombstones(self) -> int:
        """Delete the tombstones no change can still need (time <= watermark - horizon); the
        number deleted. Nothing before a watermark is declared."""
        if self._watermark is None:
            return 0
        policy = self._purge or TombstonePurge()
        bound = self._watermark - policy.horizon
        statement = sql.SQL(
            'DELETE FROM {0} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {0}'
            ' WHERE "diff" = -1 AND "time" <= %s LIMIT %s))'
        ).format(self.table)
        db = Connection(self._url, self._retry, f"txstream purge {self._table_name}")
        total = 0
        try:
            while not self._stop.is_set():  # a stop does not wait for a long first purge
                # A row updated meanwhile gets a new ctid (or no longer matches on recheck), so
                # a tombstone revived by a concurrent write is never deleted.
                deleted = db.run(lambda conn: conn.execute(
                    statement, [bound, policy.batch_rows]).rowcount)
                total += deleted
                if deleted < policy.batch_rows:
                    break
            return total
        finally:
            db.close()

    def _purge_loop(self) -> None:
        assert self._purge is not None
        while not self._stop.wait(self._purge.interval_s):
            try:
                purged = self.purge_tombstones()
            except Exception:
                log.exception("purging tombstones of %s failed", self.table.as_string())
            else:
                if purged:
                    log.info("purged %d tombstones of %s", purged, self.table.as_string())

    def close(self) -> None:
        self._stop.set()
        if self._purger is not None:
            self._purger.join()
        self._db.close()
