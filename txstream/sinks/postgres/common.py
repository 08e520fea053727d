"""What the PostgreSQL sinks share: identifier checks, table creation and validation, COPY of an
Arrow table, and running one PostgreSQL transaction with retries."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from txstream.schemas.sinks import RetryPolicy
from txstream.schemas.tables import TableSchema
from txstream.sinks.sink import SinkDataError, SinkSchemaError, SinkWriteError

log = logging.getLogger(__name__)

# PostgreSQL silently truncates longer identifiers, which could make two names collide.
MAX_IDENTIFIER_BYTES = 63
_T = TypeVar("_T")


def check_identifier(name: str, what: str) -> str:
    """`name` if PostgreSQL can hold it verbatim as an identifier (it is always quoted)."""
    if not name:
        raise SinkSchemaError(f"{what} name is empty")
    if "\x00" in name:
        raise SinkSchemaError(f"{what} name {name!r} contains a NUL character")
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise SinkSchemaError(
            f"{what} name {name!r} is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes; "
            "PostgreSQL would truncate it, choose a shorter name"
        )
    return name


def encode_csv(changes: pa.Table) -> bytes:
    """CSV for `COPY ... (FORMAT csv)`: strings are always quoted and nulls never are, which is
    how PostgreSQL tells an empty string from NULL."""
    buf = io.BytesIO()
    pacsv.write_csv(changes, buf, pacsv.WriteOptions(include_header=False))
    return buf.getvalue()


def copy_into(cur: psycopg.Cursor[tuple[object, ...]], table: sql.Composable,
              changes: pa.Table) -> None:
    """COPY all of `changes` (columns by name) into `table`."""
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in changes.column_names)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(table, columns)
    with cur.copy(statement) as copy:
        copy.write(encode_csv(changes))


def _canonical_types(conn: psycopg.Connection[tuple[object, ...]],
                     types: list[str]) -> list[str]:
    """PostgreSQL's own spelling of type names (e.g. TIMESTAMPTZ -> timestamp with time zone),
    with their modifiers: NUMERIC(12,2) -> numeric(12,2), as a table's columns are described."""
    rows = conn.execute(
        "SELECT format_type(t::regtype, NULL) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i)"
        " ORDER BY i", [[t.split("(")[0] for t in types]],
    ).fetchall()
    return [str(r[0]) + (t[t.index("("):].replace(" ", "") if "(" in t else "")
            for r, t in zip(rows, types, strict=True)]


def max_time(conn: psycopg.Connection[tuple[object, ...]], table: sql.Composable) -> int | None:
    """The greatest `time` in `table` (a scan: for start-up and recovery, not every write)."""
    row = conn.execute(sql.SQL('SELECT max("time") FROM {}').format(table)).fetchone()
    return None if row is None or row[0] is None else int(str(row[0]))


def nulls_not_distinct(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether the server has unique keys whose nulls are equal (PostgreSQL 15+)."""
    return conn.info.server_version >= 150000


def _existing_shape(conn: psycopg.Connection[tuple[object, ...]], db_schema: str, table: str
                    ) -> tuple[str, dict[str, str], list[list[str]]] | None:
    """(relkind, {column: type}, the column lists of its keys) of an existing relation, or
    None. A key is the primary key or a plain unique index whose nulls are not distinct."""
    found = conn.execute(
        "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s", [db_schema, table],
    ).fetchone()
    if found is None:
        return None
    oid, relkind = found
    columns = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", [oid],
    ).fetchall()
    unique = ("i.indisunique AND i.indnullsnotdistinct AND i.indexprs IS NULL"
              " AND i.indpred IS NULL" if nulls_not_distinct(conn) else "false")
    keys = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY k.pos) FROM pg_index i"
        " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        f" WHERE i.indrelid = %s AND (i.indisprimary OR {unique}) GROUP BY i.indexrelid"
        " ORDER BY i.indexrelid", [oid],
    ).fetchall()
    return str(relkind), {str(n): str(t) for n, t in columns}, [list(k) for (k,) in keys]


def ensure_table(conn: psycopg.Connection[tuple[object, ...]], db_schema: str, table: str,
                 schema: TableSchema, *, diff_type: str, key: tuple[str, ...],
                 replace: bool) -> None:
    """Create `db_schema.table` (columns, `time`, `diff`, unique `key` if any) if missing, or
    validate the existing one; `replace` drops it first. Runs in the caller's transaction.

    A group-by key or a distinct row may be null, so the key is `UNIQUE NULLS NOT DISTINCT`
    where the server has it (PostgreSQL 15+): nulls are values like any other. Older servers get
    a primary key, whose columns cannot hold null; rows with a null key are then refused (see
    `txstream.sinks.postgres.rejects`). An existing table keyed either way is accepted."""
    ident = sql.Identifier(db_schema, table)
    if replace:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(ident))
    want_types = [c.type.postgres for c in schema.columns] + ["BIGINT", diff_type]
    names = schema.arrow_schema(with_changes=True).names
    want = dict(zip(names, _canonical_types(conn, want_types), strict=True))
    shape = _existing_shape(conn, db_schema, table)
    if shape is None:
        nullable_key = nulls_not_distinct(conn)
        columns = [
            sql.SQL("{} {}{}").format(
                sql.Identifier(c.name), sql.SQL(c.type.postgres),
                sql.SQL("" if c.nullable and (nullable_key or c.name not in key)
                        else " NOT NULL"),
            )
            for c in schema.columns
        ] + [sql.SQL('"time" BIGINT NOT NULL'), sql.SQL(f'"diff" {diff_type} NOT NULL')]
        if key:
            key_columns = sql.SQL(", ").join(sql.Identifier(k) for k in key)
            columns.append(sql.SQL("UNIQUE NULLS NOT DISTINCT ({})" if nullable_key
                                   else "PRIMARY KEY ({})").format(key_columns))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ident, sql.SQL(", ").join(columns)))
        return
    relkind, have, keys = shape
    where = f"{db_schema}.{table}"
    if relkind not in ("r", "p"):
        raise SinkSchemaError(f"{where} exists but is not a table (relkind {relkind!r})")
    problems = [f"column {n!r} is missing" for n in want if n not in have]
    problems += [f"column {n!r} is not in the output table" for n in have if n not in want]
    problems += [
        f"column {n!r} has type {have[n]}, expected {t}"
        for n, t in want.items() if n in have and have[n] != t
    ]
    if key and list(key) not in keys:
        found = " or ".join(f"({', '.join(k)})" for k in keys) or "none"
        problems.append(f"key is {found}, expected ({', '.join(key)})")
    if problems:
        raise SinkSchemaError(
            f"existing table {where} does not match the output table: {'; '.join(problems)}. "
            "Migrate or drop it, write to another table, or use mode='replace'"
        )


class Connection:
    """One PostgreSQL connection that runs whole transactions, retrying transient failures.

    A transaction is retried from the start after a connection failure, a serialization failure
    or a deadlock, so it is either applied completely or not at all. A failure of COMMIT itself
    leaves it unknown whether the transaction was applied; callers retry only work that is
    idempotent (the progress row, the snapshot's time guard, the append sink's already-written
    check).
    """

    def __init__(self, url: str, retry: RetryPolicy, application_name: str) -> None:
        self._url = url
        # Shown in pg_stat_activity, so an operator can tell which sink holds a connection.
        self._application_name = application_name[:63]
        self._retry = retry
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        # One transaction at a time: the deliver stage writes while the checkpoint stage
        # checks the writer epoch, and two transactions on one connection would nest.
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self._url, connect_timeout=10,
                                         application_name=self._application_name)
        return self._conn

    def run(self, work: Callable[[psycopg.Connection[tuple[object, ...]]], _T]) -> _T:
        """`work(conn)` inside one transaction, retried with exponential backoff."""
        with self._lock:
            return self._run(work)

    def _run(self, work: Callable[[psycopg.Connection[tuple[object, ...]]], _T]) -> _T:
        delay = self._retry.initial_backoff_s
        for attempt in range(1, self._retry.attempts + 1):
            try:
                conn = self._connection()
                with conn.transaction():
                    return work(conn)
            except psycopg.OperationalError as exc:
                # Connection loss, serialization failure and deadlock are all OperationalErrors
                # in psycopg; the transaction was rolled back (or the connection is gone).
                if attempt == self._retry.attempts:
                    fix = ("free space on the server's disk" if isinstance(
                        exc, psycopg.errors.DiskFull) else "check that the server is reachable")
                    raise SinkWriteError(
                        f"PostgreSQL transaction failed {attempt} times, last: {exc}. "
                        f"{fix.capitalize()}, then write the same changes again"
                    ) from exc
                log.warning("PostgreSQL transaction failed (attempt %d), retrying in %.2fs: %s",
                            attempt, delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, self._retry.max_backoff_s)
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                raise SinkDataError(f"PostgreSQL rejected the data: {exc}") from exc
            except psycopg.Error as exc:
                # E.g. the table was dropped or altered under the sink: retrying cannot help.
                raise SinkWriteError(
                    f"PostgreSQL refused the transaction: {exc}. Nothing of it was applied"
                ) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
