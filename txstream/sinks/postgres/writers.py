"""One writer per pipeline: a lease that one instance holds (the others wait as standbys) and
a writer epoch that fences every other one, both in PostgreSQL beside the progress row.

Two mechanisms, because neither is enough alone:

* **The lease** is a session-level advisory lock (`pg_try_advisory_lock`) on a key derived
  from the schema and the pipeline (its consumer group), held by the active instance on a
  connection of its own for its whole life. PostgreSQL releases it the moment that session
  ends: a process killed (kill -9, OOM) closes its socket, so a standby polling every second
  takes over within about a second. A holder that cannot end its session (a paused process,
  a partitioned node) is cut off by the server itself: the lease connection sets
  `idle_session_timeout` (PostgreSQL 14+) to `lease_s` and the holder renews it with a
  heartbeat query every `lease_s / 4`; a holder silent for `lease_s` loses its session, hence
  the lock. The server's own timer needs neither TCP keepalives nor the client's clock. A
  heartbeat table renewed by the holder would do the same with more writes and a clock
  comparison; the lock also costs nothing to watch.
* **The epoch** makes a lost lease harmless. The lock says who *should* write; it cannot stop a
  holder that was paused, lost its lock meanwhile and wakes up in the middle of a batch. So
  the instance that gets the lock takes the next epoch of `txstream_writers` (one row per
  pipeline, one atomic `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`), recording its host,
  pid and start time, and every PostgreSQL transaction that writes a batch first reads that
  row `FOR SHARE` (`WriterEpoch.check`): an epoch that moved on means another instance
  took over, and the transaction raises `WriterFencedError` before writing anything. Taking
  an epoch updates the row, so it waits for a write in flight to commit, and a write that
  starts after it sees the new epoch: no batch of the old writer commits after the new one
  took over. A write transaction also sets `idle_in_transaction_session_timeout` to
  `lease_s`, so a holder paused inside one does not block the takeover for longer.

Kafka's producer epochs work the same way (`transactional.id`, `txstream.sinks.kafka_sink`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from datetime import UTC, datetime

import psycopg
from psycopg import sql
from pydantic import BaseModel, ConfigDict

from txstream.sinks.postgres.common import check_identifier
from txstream.sinks.sink import FencedError

WRITERS_TABLE = "txstream_writers"
LEASE_S = 10.0  # a silent holder loses its lease after this long (see the module's doc)

log = logging.getLogger(__name__)
PgConnection = psycopg.Connection[tuple[object, ...]]


class Writer(BaseModel):
    """An instance that took (or will take) a pipeline's epoch: where and since when it runs."""

    model_config = ConfigDict(frozen=True)

    host: str
    pid: int
    started_at: datetime

    @staticmethod
    def this_process() -> Writer:
        return Writer(host=socket.gethostname(), pid=os.getpid(), started_at=datetime.now(UTC))

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started_at.isoformat()}"


class WriterFencedError(FencedError):
    """Another instance took the pipeline's writer epoch: this one must write nothing more."""

    def __init__(self, pipeline: str, epoch: int, current: tuple[int, Writer] | None) -> None:
        self.holder = current[1] if current else None
        by = (f"by epoch {current[0]}, taken by {current[1]}" if current
              else "(its row of txstream_writers was deleted)")
        super().__init__(
            f"pipeline {pipeline!r}: this instance (writer epoch {epoch}) was fenced {by}. "
            "It wrote nothing after that and stops consuming; "
            "two instances ran with the same consumer_group and database. Leave one of them "
            "running (this one waits as a standby), or give the other its own consumer_group")


class WritersTable:
    """The `txstream_writers` table of `db_schema`: a pipeline's current epoch and its writer."""

    def __init__(self, db_schema: str, pipeline: str) -> None:
        self.ident = sql.Identifier(check_identifier(db_schema, "database schema"),
                                    WRITERS_TABLE)
        self.pipeline = pipeline
        # The advisory lock's key: 64 bits of a hash of where the epoch lives, so pipelines
        # (and schemas) never share a lock.
        digest = hashlib.blake2b(f"txstream:{db_schema}:{pipeline}".encode(), digest_size=8)
        self.lock_key = int.from_bytes(digest.digest(), "big", signed=True)

    def create(self, conn: PgConnection) -> None:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT PRIMARY KEY, epoch BIGINT NOT NULL,"
            " host TEXT NOT NULL, pid INTEGER NOT NULL, started_at TIMESTAMPTZ NOT NULL,"
            " taken_at TIMESTAMPTZ NOT NULL)").format(self.ident))

    def take(self, conn: PgConnection, writer: Writer) -> int:
        """The next epoch, recorded as `writer`'s (waits for a write of the previous one in
        flight)."""
        row = conn.execute(sql.SQL(
            "INSERT INTO {} AS w (pipeline, epoch, host, pid, started_at, taken_at)"
            " VALUES (%s, 1, %s, %s, %s, now()) ON CONFLICT (pipeline) DO UPDATE SET"
            " epoch = w.epoch + 1, host = EXCLUDED.host, pid = EXCLUDED.pid,"
            " started_at = EXCLUDED.started_at, taken_at = now() RETURNING epoch"
        ).format(self.ident), [self.pipeline, writer.host, writer.pid,
                               writer.started_at]).fetchone()
        assert row is not None  # an upsert returns its row
        return int(str(row[0]))

    def current(self, conn: PgConnection, *, lock: bool) -> tuple[int, Writer] | None:
        """The epoch and its writer (None: never taken); `lock`: share-locked until the
        transaction ends, so no epoch is taken meanwhile."""
        row = conn.execute(sql.SQL(
            "SELECT epoch, host, pid, started_at FROM {} WHERE pipeline = %s{}").format(
                self.ident, sql.SQL(" FOR SHARE" if lock else "")), [self.pipeline]).fetchone()
        if row is None:
            return None
        epoch, host, pid, started_at = row
        return int(str(epoch)), Writer.model_validate(
            {"host": host, "pid": pid, "started_at": started_at})


class WriterEpoch:
    """The epoch this instance took: `check` it in every transaction that writes."""

    def __init__(self, table: WritersTable, epoch: int, lease_s: float = LEASE_S) -> None:
        self.table = table
        self.epoch = epoch
        self.lease_s = lease_s

    def check(self, conn: PgConnection) -> None:
        """Raise WriterFencedError unless the epoch is still this one's; share-locks it until
        `conn`'s transaction ends, so none is taken before it commits."""
        conn.execute(sql.SQL("SET LOCAL idle_in_transaction_session_timeout = {}").format(
            sql.Literal(f"{int(self.lease_s * 1000)}ms")))
        found = self.table.current(conn, lock=True)
        if found is None or found[0] != self.epoch:
            raise WriterFencedError(self.table.pipeline, self.epoch, found)


class Lease:
    """The advisory lock of a pipeline's writer, on a connection of its own (see the module's
    doc). `try_take` takes the lock and the next epoch; `renew` keeps it."""

    def __init__(self, url: str, table: WritersTable, writer: Writer,
                 lease_s: float = LEASE_S) -> None:
        self.table = table
        self.writer = writer
        self.lease_s = lease_s
        self._url = url
        self._conn: PgConnection | None = None
        self._lock = threading.Lock()  # the heartbeat thread and the owner share the connection

    def _connection(self) -> PgConnection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self._url, autocommit=True, connect_timeout=10,
                                         application_name="txstream writer lease")
            if self._conn.info.server_version >= 140000:
                self._conn.execute(sql.SQL("SET idle_session_timeout = {}").format(
                    sql.Literal(f"{int(self.lease_s * 1000)}ms")))
            else:  # only the end of the holder's connection releases the lock
                log.warning("PostgreSQL before 14 has no idle_session_timeout: a paused writer "
                            "keeps its lease until its connection dies")
            self.table.create(self._conn)
        return self._conn

    def try_take(self) -> WriterEpoch | None:
        """The next epoch if the lock was free (now held), else None (a live holder has it)."""
        with self._lock:
            conn = self._connection()
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", [self.table.lock_key]
                               ).fetchone()
            if row is None or not row[0]:
                return None
            with conn.transaction():
                epoch = self.table.take(conn, self.writer)
        log.info("took writer epoch %d of pipeline %r (%s)", epoch, self.table.pipeline,
                 self.writer)
        return WriterEpoch(self.table, epoch, self.lease_s)

    def holder(self) -> tuple[int, Writer] | None:
        """Who took the current epoch (a standby's view of the active instance)."""
        with self._lock:
            return self.table.current(self._connection(), lock=False)

    def renew(self) -> bool:
        """Keep the session (hence the lock) alive; False once it was lost (a PostgreSQL
        restart, a pause past the lease). It is not locked again: the holder goes on writing
        until another instance takes the lock and the next epoch, which fences it."""
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                return False
            try:
                self._conn.execute("SELECT 1")
                return True
            except psycopg.Error as exc:
                log.warning("writer lease of pipeline %r lost: %s", self.table.pipeline, exc)
                self._conn.close()
                return False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()  # the session ends, and the lock with it
                self._conn = None
