"""Rows PostgreSQL refuses, isolated so that the rest of a write goes through.

A write applies its rows inside a savepoint. When PostgreSQL refuses the data (a value out of
a column's range, a constraint added to the table by someone else, a NUL character), the
savepoint is rolled back and each half is applied the same way, down to single rows: the rows
refused on their own are the rejects, found in O(rejects x log rows) statements, and every other
row is written. Rejects are stored in the table `txstream_rejects` of the sink's database schema,
in the same PostgreSQL transaction as the rows written, with the output table's name, the
change's `time` and `diff`, PostgreSQL's reason and the row as JSON: a replay after a crash
neither loses nor duplicates them. The pipeline goes on; nothing is dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pyarrow as pa
from psycopg import sql

from txstream.changes import DIFF, TIME
from txstream.sinks.change_json import dumps, json_rows

log = logging.getLogger(__name__)

REJECTS_TABLE = "txstream_rejects"

PgConnection = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class Rejects:
    """Rows of one write that PostgreSQL refused, each with its reason."""

    rows: pa.Table
    reasons: list[str]

    @property
    def count(self) -> int:
        return self.rows.num_rows


def ensure_rejects_table(conn: PgConnection, db_schema: str) -> None:
    """Create the schema's rejects table if missing (idempotent)."""
    table = sql.Identifier(db_schema, REJECTS_TABLE)
    conn.execute(sql.SQL(
        'CREATE TABLE IF NOT EXISTS {} (output_table TEXT NOT NULL, "time" BIGINT NOT NULL,'
        ' "diff" BIGINT NOT NULL, reason TEXT NOT NULL, row_json TEXT NOT NULL,'
        " rejected_at TIMESTAMPTZ NOT NULL DEFAULT now())").format(table))
    # A replayed write finds its rejects already there.
    conn.execute(sql.SQL(
        'CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} (output_table, "time", "diff", md5(row_json))'
    ).format(sql.Identifier(f"{REJECTS_TABLE}_once"), table))


def forget_rejects(conn: PgConnection, db_schema: str, output_table: str) -> None:
    """Delete an output table's rejects: it is recreated, and its transactions numbered anew."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE output_table = %s").format(
        sql.Identifier(db_schema, REJECTS_TABLE)), [output_table])


def _reason(exc: psycopg.Error) -> str:
    diag = exc.diag
    parts = [diag.message_primary or str(exc).strip().splitlines()[0]]
    if diag.message_detail:
        parts.append(diag.message_detail)
    return ": ".join(parts)


def apply_isolating(conn: PgConnection, rows: pa.Table,
                    apply: Callable[[PgConnection, pa.Table], None]) -> Rejects:
    """`apply(conn, part)` for all of `rows`, in the caller's transaction; the rows PostgreSQL
    refuses (data or integrity errors) are left out and returned. Connection failures and
    other errors propagate: the caller's transaction is then retried or fails whole."""
    refused: list[int] = []
    reasons: list[str] = []

    def attempt(lo: int, hi: int) -> None:
        try:
            with conn.transaction():  # a savepoint inside the caller's transaction
                apply(conn, rows.slice(lo, hi - lo))
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if hi - lo == 1:
                refused.append(lo)
                reasons.append(_reason(exc))
                return
            mid = (lo + hi) // 2
            attempt(lo, mid)
            attempt(mid, hi)

    if rows.num_rows:
        attempt(0, rows.num_rows)
    return Rejects(rows.take(pa.array(refused, pa.int64())), reasons)


def record_rejects(conn: PgConnection, db_schema: str, output_table: str,
                   rejects: Rejects) -> None:
    """Store `rejects` in the schema's rejects table, in the caller's transaction."""
    if not rejects.count:
        return
    rows = json_rows(rejects.rows)
    statement = sql.SQL(
        'INSERT INTO {} (output_table, "time", "diff", reason, row_json)'
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
    ).format(sql.Identifier(db_schema, REJECTS_TABLE))
    with conn.cursor() as cur:
        cur.executemany(statement, [
            (output_table, row[TIME], row[DIFF], reason, dumps(row).decode())
            for row, reason in zip(rows, rejects.reasons, strict=True)])
    # The reasons may quote values: they stay in the table, out of the logs.
    log.warning("%s: PostgreSQL refused %d row(s), kept with the reasons in %s.%s",
                output_table, rejects.count, db_schema, REJECTS_TABLE)
