"""Every change of an output table appended to a PostgreSQL table ("stream of changes").

The table holds the columns plus `time` (BIGINT) and `diff` (BIGINT: a table without key is a
multiset, its weights are any integer) and no key. Each write is one COPY in one transaction.

Replays after a crash must not append a transaction twice. The sink assumes it is the table's
only writer and writes transactions in time order (the engine's output), so it skips every
change whose time is not above the greatest time already in the table: the time it last wrote,
or, at start and after a write whose outcome is unknown (the connection failed around COMMIT),
the table's own greatest time (a scan). Written with the other PostgreSQL outputs of a pipeline
(`txstream.sinks.postgres.outputs`), the progress row decides instead, without a scan. Rows
PostgreSQL refuses go to the rejects table in the same transaction
(`txstream.sinks.postgres.rejects`).
"""

from __future__ import annotations

from typing import Literal

import psycopg
import pyarrow as pa
from psycopg import sql

from txstream.changes import Changes
from txstream.schemas.sinks import RetryPolicy
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


class PostgresAppendSink(SinkBase):
    def __init__(self, url: str, table: str, schema: TableSchema, *, db_schema: str = "public",
                 mode: Literal["create", "replace"] = "create",
                 retry: RetryPolicy | None = None) -> None:
        if mode not in ("create", "replace"):
            raise SinkSchemaError(f"mode must be 'create' or 'replace', not {mode!r}")
        self.schema = schema
        self._db_schema = check_identifier(db_schema, "database schema")
        self._table_name = check_identifier(table, "table")
        self.table = sql.Identifier(self._db_schema, self._table_name)
        self._db = Connection(url, retry or RetryPolicy(), f"txstream append {table}")
        # Set while the table may hold transactions the sink does not know of: at start, and
        # after a write whose outcome was lost (see the module doc).
        self._unsure = True
        self._last_time: int | None = None
        try:
            self._db.run(lambda conn: self._set_up(conn, replace=mode == "replace"))
        except BaseException:
            self._db.close()
            raise

    def _set_up(self, conn: psycopg.Connection[tuple[object, ...]], *, replace: bool) -> None:
        ensure_table(conn, self._db_schema, self._table_name, self.schema, diff_type="BIGINT",
                     key=(), replace=replace)
        ensure_rejects_table(conn, self._db_schema)
        if replace:
            forget_rejects(conn, self._db_schema, self._table_name)

    def write(self, changes: Changes) -> None:
        batch = conform_changes(changes, self.schema).after(self._last_time)
        if not batch.num_rows:
            return

        def append(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            rows = batch
            if self._unsure:
                rows = batch.after(max_time(conn, self.table))
            self._unsure = True
            return self.apply(conn, rows)

        self.rejected_rows += self._db.run(append)
        self._unsure = False
        self._last_time = batch.last_time()

    def apply(self, conn: psycopg.Connection[tuple[object, ...]], changes: Changes) -> int:
        """Append `changes` in the caller's transaction, which decides what is new (see
        `txstream.sinks.postgres.outputs`); the number of rows refused."""
        batch = conform_changes(changes, self.schema).table

        def copy(conn: psycopg.Connection[tuple[object, ...]], part: pa.Table) -> None:
            with conn.cursor() as cur:
                copy_into(cur, self.table, part)

        rejects = apply_isolating(conn, batch, copy)
        record_rejects(conn, self._db_schema, self._table_name, rejects)
        return rejects.count

    def held_through(self) -> int | None:
        return self._db.run(lambda conn: max_time(conn, self.table))

    def written_through(self, conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
        return max_time(conn, self.table)

    def close(self) -> None:
        self._db.close()
