"""Every PostgreSQL output of a pipeline committed together: one PostgreSQL transaction per
batch (or, as a setting, per stream transaction) across all output tables, with the pipeline's
row of the progress table `txstream_progress`.

A reader of the database never sees one output table at transaction N and another at N-1, and
`SELECT * FROM txstream_progress` says which transaction the tables reflect, with the upstream
transaction ids it carries and the source offsets to resume from. The progress row also makes
the writes exactly once: each PostgreSQL transaction first locks it and writes only changes
after the transaction it names, so a batch replayed after a crash, or written again after a
COMMIT whose outcome was lost, adds nothing twice, without reading any output table (until
the row exists, each append table's greatest `time` decides, as for tables an earlier release
wrote).

With a writer epoch (`fence`, see `txstream.sinks.postgres.writers`), each transaction first
checks that the epoch is still this instance's, so an instance another one took over from
writes nothing more.

The row belongs to one pipeline (its consumer group): other pipelines' rows are never read or
written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import psycopg
import pyarrow as pa
from psycopg import sql

from txstream.changes import Changes
from txstream.schemas.sinks import RetryPolicy
from txstream.sinks.postgres.common import Connection, check_identifier
from txstream.sinks.postgres.writers import WriterEpoch

PROGRESS_TABLE = "txstream_progress"

PgConnection = psycopg.Connection[tuple[object, ...]]
Offsets = Mapping[str, Mapping[int, int]]


class PostgresTable(Protocol):
    """A PostgreSQL sink that writes inside a transaction another party commits."""

    rejected_rows: int

    def apply(self, conn: PgConnection, changes: pa.Table) -> int:
        """Write `changes` in `conn`'s transaction; the number of rows refused."""
        ...

    def written_through(self, conn: PgConnection) -> int | None:
        """The last transaction the table holds where a replay would duplicate it (an append
        table; None for a table whose writes are idempotent): read only without a progress
        row, e.g. tables an earlier release wrote."""
        ...


@dataclass(frozen=True)
class Mark:
    """What the progress row says once a stream transaction is committed."""

    transaction: int
    upstream_ids: tuple[str, ...]
    offsets: Offsets  # topic -> partition -> next offset to consume


class PostgresOutputs:
    """The PostgreSQL sinks of one pipeline (`tables`: output name -> its sinks), written in
    one transaction per batch (`commit="batch"`) or per stream transaction
    (`commit="transaction"`), with the row `pipeline` of `db_schema.txstream_progress`."""

    def __init__(self, url: str, tables: Mapping[str, Sequence[PostgresTable]], *,
                 pipeline: str, definition: str, db_schema: str = "public",
                 commit: Literal["batch", "transaction"] = "batch",
                 retry: RetryPolicy | None = None, start_over: bool = False,
                 fence: WriterEpoch | None = None) -> None:
        """`start_over`: every table was just recreated empty, so the pipeline's progress row
        is deleted too. `fence`: the writer epoch every transaction checks (None: unfenced)."""
        self._fence = fence
        self._tables = {name: list(sinks) for name, sinks in tables.items() if sinks}
        self._pipeline = pipeline
        self._definition = definition
        self._commit = commit
        self.progress = sql.Identifier(check_identifier(db_schema, "database schema"),
                                       PROGRESS_TABLE)
        self._db = Connection(url, retry or RetryPolicy(), "txstream outputs")
        try:
            self._db.run(lambda conn: self._set_up(conn, start_over))
        except BaseException:
            self._db.close()
            raise

    def _set_up(self, conn: PgConnection, start_over: bool) -> None:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT PRIMARY KEY, definition TEXT NOT NULL,"
            ' "transaction" BIGINT NOT NULL, upstream_ids TEXT[] NOT NULL, offsets JSONB NOT NULL,'
            " committed_at TIMESTAMPTZ NOT NULL)").format(self.progress))
        if start_over:
            conn.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s").format(self.progress),
                         [self._pipeline])

    def committed(self) -> int | None:
        """The last transaction the progress row says is committed, None without a row."""
        row = self._db.run(lambda conn: conn.execute(sql.SQL(
            'SELECT "transaction" FROM {} WHERE pipeline = %s').format(self.progress),
            [self._pipeline]).fetchone())
        return None if row is None else int(str(row[0]))

    def write(self, outputs: Mapping[str, Changes], marks: Sequence[Mark]) -> None:
        """Commit the outputs' changes of consecutive stream transactions (`marks`, in order)."""
        if not marks:
            return
        if self._commit == "batch":
            self._write(outputs, Mark(marks[-1].transaction, tuple(
                u for m in marks for u in m.upstream_ids), marks[-1].offsets))
            return
        for mark in marks:
            self._write({name: changes.at(mark.transaction)
                         for name, changes in outputs.items()}, mark)

    def check_writer(self) -> None:
        """WriterFencedError if another instance took the writer epoch (nothing without one)."""
        if self._fence is not None:
            self._db.run(self._fence.check)

    def _write(self, outputs: Mapping[str, Changes], mark: Mark) -> None:
        def work(conn: PgConnection) -> list[tuple[PostgresTable, int]]:
            if self._fence is not None:
                self._fence.check(conn)
            row = conn.execute(sql.SQL(
                'SELECT "transaction" FROM {} WHERE pipeline = %s FOR UPDATE').format(
                    self.progress), [self._pipeline]).fetchone()
            done = None if row is None else int(str(row[0]))
            if done is not None and mark.transaction <= done:
                return []  # committed before: a replay, or a retry after a lost COMMIT
            refused: list[tuple[PostgresTable, int]] = []
            for name, changes in outputs.items():
                for sink in self._tables.get(name, ()):
                    after = done if done is not None else sink.written_through(conn)
                    new = changes.after(after)
                    if new.num_rows:
                        refused.append((sink, sink.apply(conn, new)))
            conn.execute(sql.SQL(
                'INSERT INTO {} (pipeline, definition, "transaction", upstream_ids, offsets,'
                " committed_at) VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (pipeline) DO"
                ' UPDATE SET definition = EXCLUDED.definition, "transaction" ='
                ' EXCLUDED."transaction", upstream_ids = EXCLUDED.upstream_ids, offsets ='
                " EXCLUDED.offsets, committed_at = EXCLUDED.committed_at").format(self.progress),
                [self._pipeline, self._definition, mark.transaction, list(mark.upstream_ids),
                 json.dumps({t: {str(p): o for p, o in parts.items()}
                             for t, parts in mark.offsets.items()})])
            return refused

        for sink, count in self._db.run(work):  # counted once committed
            sink.rejected_rows += count

    def close(self) -> None:
        self._db.close()
