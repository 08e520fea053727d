"""One active instance per pipeline, the others standbys: the service's side of
`txstream.sinks.postgres.writers` (why a lease and an epoch, and how they work, is there).

`Leadership.wait_for_turn` runs before the runner is built: while another live instance holds
the pipeline's lease, this one waits (`/healthz` 200, `/readyz` 503 `standby`), polling the
lease every second with its Spark session already up; once the lease is free it takes the next
writer epoch, and the runner restores the newest checkpoint and resumes. While active, a thread
renews the lease. An instance fenced by another one (a `FencedError`: `WriterFencedError` from
a write or before a checkpoint is published, or a Kafka sink's producer fenced by the new
writer's) stops its runner, counts it (`txstream_fenced_total`), logs who took over, and waits
again (`/readyz` 503 `fenced`) instead of exiting: an exit would only make Kubernetes restart
it into the same wait, with a cold start, and a fenced instance that waits is the new holder's
standby.

A pipeline without a PostgreSQL sink has no lease (`Leadership.of` is None): nothing makes a
second instance wait. It is fenced through its checkpoint location instead
(`txstream.service.checkpoint_epochs`): the instance that starts last takes the newest epoch,
and the one it fenced reports it the same way (`report_fenced`) and waits until it is
stopped, with no lease to wait for.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from txstream.schemas.config import PipelineConfig
from txstream.service.health import Readiness
from txstream.service.metrics import Metrics
from txstream.sinks.postgres.writers import LEASE_S, Lease, Writer, WriterEpoch, WritersTable
from txstream.sinks.sink import FencedError

log = logging.getLogger(__name__)

POLL_S = 1.0  # a standby's look at the lease: the takeover after a kill takes about this long


class Leadership:
    """The lease of one pipeline's writer, taken and kept by this process."""

    def __init__(self, url: str, table: WritersTable, readiness: Readiness, metrics: Metrics,
                 stop: threading.Event, lease_s: float = LEASE_S) -> None:
        self._lease = Lease(url, table, Writer.this_process(), lease_s)
        self._readiness = readiness
        self._metrics = metrics
        self._stop = stop
        self._released = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @staticmethod
    def of(config: PipelineConfig, readiness: Readiness, metrics: Metrics,
           stop: threading.Event) -> Leadership | None:
        """The lease in the first PostgreSQL sink's schema, beside the progress row; None for
        a pipeline without PostgreSQL sinks (not fenced)."""
        first = next((s for cfg in config.sinks if (s := cfg.settings.postgres) is not None),
                     None)
        if first is None:
            return None
        assert config.database_dsn is not None  # the configuration's own check
        return Leadership(config.database_dsn, WritersTable(first.db_schema,
                                                            config.consumer_group),
                          readiness, metrics, stop)

    def wait_for_turn(self, reason: str = "standby") -> WriterEpoch | None:
        """Wait until this process holds the lease, not ready with `reason` meanwhile; the
        epoch it took, or None if a stop was requested first."""
        self._readiness.wait_as(reason)
        seen: tuple[int, Writer] | None = None
        while not self._stop.is_set():
            try:
                epoch = self._lease.try_take()
                if epoch is not None:
                    self._readiness.ok("postgresql")
                    self._readiness.wait_as(None)
                    self._start_heartbeat()
                    return epoch
                holder = self._lease.holder()
                self._readiness.ok("postgresql")
            except psycopg.Error as exc:
                self._readiness.fail("postgresql", str(exc).splitlines()[0])
                self._lease.close()
            else:
                if holder != seen:  # once per holder, not every second
                    seen = holder
                    log.warning("%s: pipeline %r is written by %s; waiting for its lease",
                                reason, self._lease.table.pipeline,
                                f"epoch {holder[0]} ({holder[1]})" if holder else "a starting "
                                "instance")
            self._stop.wait(POLL_S)
        return None

    def fenced(self, exc: FencedError) -> None:
        """Another instance took over: report it, give the lease up (it is lost already, or
        about to be: the other one holds it); `wait_for_turn("fenced")` next."""
        report_fenced(exc, self._readiness, self._metrics)
        self.release()

    def _start_heartbeat(self) -> None:
        self._released.clear()
        self._heartbeat = threading.Thread(target=self._renew, name="writer-lease",
                                           daemon=True)
        self._heartbeat.start()

    def _renew(self) -> None:
        while not self._released.wait(self._lease.lease_s / 4):
            if not self._lease.renew():
                # Writing goes on: the epoch, not the lock, decides whether a write commits.
                log.warning("writer lease of pipeline %r lost: a standby may take over and "
                            "fence this instance", self._lease.table.pipeline)
                return

    def release(self) -> None:
        """Stop renewing and end the lease's session (the lock goes with it)."""
        self._released.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        self._lease.close()


def report_fenced(exc: FencedError, readiness: Readiness, metrics: Metrics) -> None:
    """Not ready (`fenced`) from now on, not once the runner is closed; counted and logged with
    what fenced this instance."""
    readiness.wait_as("fenced")
    metrics.delivery.lost_writer_epoch()
    log.error("fenced: %s", exc)
