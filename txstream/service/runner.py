"""The service: a pipeline of stages joined by bounded queues.

    ingest -> compute -> deliver (+ commit) -> checkpoint
    (poll, decode, dead-letter, form transactions) -> (log, engine) -> (every sink of a batch
    in parallel, then the source offsets) -> (in the background, from a committed version)

Each stage runs in a thread of its own and waits when the next one is behind (backpressure):
ingest holds at most `batch_transactions` closed transactions ready, compute hands over at
most one computed batch, so memory stays bounded by about three batches of changes (the one
being computed, one waiting for the sinks, the one being written). Throughput is that of the
slowest stage, not the sum of all.

Batches adapt to the load: compute takes every transaction ready when it is free, up to
`batch_transactions`. At low load that is one transaction, processed as soon as it closes;
under a backlog the batches grow, so the engine's cost per batch is shared by more events.

The runner knows neither Kafka nor Spark: its input is `txstream.sources.kafka_input`, its engine
and checkpoint store are handed to it (`txstream.service.compose.open_runner` builds them).

The guarantees are those of a sequential loop:
* a batch's transactions are in the transaction log before the engine runs them, so before
  any sink sees them;
* offsets are committed only after every sink committed the batch, batches in order;
* a checkpoint holds the source state and the engine's state as of one committed transaction
  (the engine may be further ahead: its versions are immutable, see `Engine.version`).

After a crash the runner loads the newest complete checkpoint and the transactions logged after
it; the builder re-forms those from the same records with the same numbers and boundaries, the
engine recomputes them, and the sinks receive them again:
* the PostgreSQL outputs are written in one PostgreSQL transaction per batch with the
  pipeline's progress row, which says the last transaction they hold: a replay adds nothing
  twice (`txstream.sinks.postgres_outputs`); snapshots also keep a per-key time guard;
* a Kafka sink reads back the last transaction its topic holds and skips the replay up to it;
* a file sink may receive a replayed transaction a second time (same number, same changes:
  readers can deduplicate by `time`).
The Kafka consumer group's committed offsets are for monitoring only: a restart resumes from
the checkpoint's offsets, which belong with the engine's state.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa

from txstream.engine.errors import ExpressionError
from txstream.schemas.config import ConfigError, PipelineConfig, SinkConfig
from txstream.schemas.sinks import PostgresAppendSettings, PostgresSnapshotSettings
from txstream.service.checkpoint import CheckpointError
from txstream.service.health import Progress, Readiness
from txstream.sinks.factory import open_sink
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.postgres_outputs import Mark, PostgresOutputs, PostgresTable
from txstream.sinks.sink import Sink, SinkWriteError
from txstream.sources.kafka_input import KafkaInput
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.transaction_batch import TransactionBatch
from txstream.sources.transactions import (
    SourceState,
    Transaction,
)

if TYPE_CHECKING:
    from txstream.engine import Engine, EngineVersion
    from txstream.service.checkpoint import CheckpointStore

__all__ = ["PipelineRunner", "Progress", "ShutdownRequested"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Fault injection for the crash tests: `TXSTREAM_CRASH_AT=<point>:<n>` kills the process with
# SIGKILL the n-th time it reaches <point>: `log` (batch logged, nothing written), `sink_write`
# (the first sink of a batch written, the others not), `commit` (sinks written, offsets not
# committed), `checkpoint` (checkpoint data written, manifest not).
CRASH_ENV = "TXSTREAM_CRASH_AT"


class ShutdownRequested(Exception):
    """A stop was requested while a stage waited for an unavailable dependency: the current
    batch is abandoned (recovery replays it)."""


class _CrashPoints:
    def __init__(self, spec: str | None) -> None:
        self._point, self._countdown = None, 0
        if spec:
            point, _, n = spec.partition(":")
            self._point, self._countdown = point, int(n or "1")

    def reached(self, point: str) -> None:
        if point == self._point:
            self._countdown -= 1
            if self._countdown == 0:
                log.warning("%s=%s: killing the process", CRASH_ENV, os.environ.get(CRASH_ENV))
                os.kill(os.getpid(), signal.SIGKILL)


def _postgres(cfg: SinkConfig) -> bool:
    return cfg.settings.kind.startswith("postgres")


def _dependency(cfg: SinkConfig) -> str:
    return "postgresql" if _postgres(cfg) else f"{cfg.settings.kind} sink"


class _Reports:
    """The input monitor's measurements, into the service's metrics and readiness."""

    def __init__(self, progress: Progress, readiness: Readiness, dependency: str) -> None:
        self._progress = progress
        self._readiness = readiness
        self._dependency = dependency

    def lag(self, by_partition: dict[tuple[str, int], int]) -> None:
        self._progress.lag_by_partition = by_partition
        self._progress.lag = sum(by_partition.values())

    def latency(self, seconds: float) -> None:
        self._progress.end_to_end_seconds.observe(seconds)

    def reachable(self, problem: str | None) -> None:
        if problem is None:
            self._readiness.ok(self._dependency, observer="monitor")
        else:
            self._readiness.fail(self._dependency, problem, observer="monitor")


class EarlierOutputError(ConfigError):
    """A run from scratch found sinks holding an earlier run's output."""


def _where(cfg: SinkConfig) -> str:
    settings = cfg.settings
    if (table := getattr(settings, "table", None)) is not None:
        return f"table {getattr(settings, 'db_schema', 'public')}.{table}"
    if (path := getattr(settings, "path", None)) is not None:
        return f"file {path}"
    if settings.kind == "live":
        return "its table saved in live.state_dir"
    return f"topic {getattr(settings, 'topic', '?')}"


class PipelineRunner:
    """Runs one configured pipeline until told to stop.

    Construction restores the newest checkpoint (or starts from scratch) and connects to Kafka
    and the sinks, retrying while they are unavailable. `run` runs the stages (see the module's
    docstring); `request_stop` (e.g. from a SIGTERM handler) makes it return once the batches
    already computed are delivered; `checkpoint` then `close`.
    """

    def __init__(self, config: PipelineConfig, *, engine: Engine, checkpoints: CheckpointStore,
                 progress: Progress | None = None, readiness: Readiness | None = None,
                 live: LiveTables | None = None) -> None:
        """`engine` and `checkpoints`: the pipeline's compute and state storage, composed by
        `txstream.service.compose.open_runner`. `progress` and `readiness`: given when an HTTP
        endpoint serves them from before the runner exists (restoring and connecting take a while).
        `live`: the tables of the outputs with a live sink."""
        self.config = config
        self.live = live
        self.engine = engine
        self.checkpoints = checkpoints
        self.progress = progress or Progress()
        self.readiness = readiness or Readiness(config.ready_max_lag)
        self._stop = threading.Event()
        self._crash = _CrashPoints(os.environ.get(CRASH_ENV))
        assert config.kafka_bootstrap_servers is not None
        latest = self.checkpoints.latest()
        # Sinks may hold transactions of an earlier run exactly when there is a checkpoint or a
        # logged transaction; only a start from scratch may recreate `mode: replace` tables.
        resuming = self.checkpoints.has_history()
        if latest is not None:
            state = self.checkpoints.load_source_state(latest)
            self.engine.load_state(self.checkpoints.engine_uri(latest))
            self._checkpointed = latest.transaction
            self.progress.last_checkpoint_transaction = latest.transaction
        else:
            # No checkpoint: the engine state is empty, so the input starts at the beginning
            # of every topic (whatever offsets the consumer group committed).
            state = SourceState(next_number=1, offsets={}, upsert_rows={
                s.name: s.table_schema.arrow_schema().empty_table()
                for s in config.sources if s.semantics == "upsert"})
            self._checkpointed = 0
        replay = self.checkpoints.logged_after(self._checkpointed)
        self._logged_through = self._checkpointed + len(replay)
        self._last_checkpoint = time.monotonic()
        self._batches_since_checkpoint = 0
        # The last transaction every sink committed, and the engine's state as of it.
        self._committed: tuple[int, EngineVersion | None] = (self._checkpointed, None)
        self._announced = self._checkpointed  # the newest checkpoint the sinks were told of
        self.progress.last_transaction = self._checkpointed
        if latest is not None or replay:
            log.info("resuming after transaction #%d (%s); replaying %d logged transaction(s)",
                     self._checkpointed, latest.name if latest else "no checkpoint", len(replay))
        self.sinks: dict[str, list[tuple[SinkConfig, Sink]]] = self._retrying(
            "postgresql", lambda: self._open_sinks(resuming))
        self._postgres = self._retrying("postgresql",
                                        lambda: self._open_postgres_outputs(resuming))
        if not resuming:
            self._refuse_earlier_output()
        else:
            self._refuse_stale_saved_state()
        if resuming and self._postgres is not None:
            committed = self._postgres.committed()
            if committed is not None and committed > self._logged_through:
                self._close_sinks()
                raise CheckpointError(
                    f"the progress row of pipeline {config.consumer_group!r} says its "
                    f"PostgreSQL outputs hold transactions up to #{committed}, but "
                    f"{config.checkpoint_location} knows them only up to "
                    f"#{self._logged_through}: the checkpoint location is older than the "
                    "outputs (restored from a backup?). Use the newest checkpoint location, or "
                    "start over (an empty checkpoint location and `mode: replace` on every "
                    "PostgreSQL sink)")
        self.input = self._retrying(KafkaInput.name, lambda: KafkaInput(
            config, state, replay, _Reports(self.progress, self.readiness, KafkaInput.name)))
        self._stages = _Stages(config.batch_transactions, serving=False)
        sink_count = sum(len(sinks) for sinks in self.sinks.values())
        self._sink_pool = ThreadPoolExecutor(max_workers=max(1, sink_count),
                                             thread_name_prefix="sink")

    # ---- connections ---------------------------------------------------------------------

    def _open_sinks(self, resuming: bool) -> dict[str, list[tuple[SinkConfig, Sink]]]:
        opened: dict[str, list[tuple[SinkConfig, Sink]]] = {}
        try:
            for cfg in self.config.sinks:
                settings = cfg.settings
                if resuming and getattr(settings, "mode", None) == "replace":
                    settings = settings.model_copy(update={"mode": "create"})
                sink = open_sink(settings, cfg.output, self.engine.outputs[cfg.output].schema,
                                 database_url=self.config.database_dsn,
                                 kafka_bootstrap_servers=self.config.kafka_bootstrap_servers,
                                 kafka_security=self.config.kafka_security, live=self.live,
                                 live_state_dir=self.config.live_state_dir if self.live else None)
                opened.setdefault(cfg.output, []).append((cfg, sink))
        except BaseException:
            for sinks in opened.values():
                for _, sink in sinks:
                    sink.close()
            raise
        return opened

    def _open_postgres_outputs(self, resuming: bool) -> PostgresOutputs | None:
        """The PostgreSQL sinks, committed together with the pipeline's progress row (which a
        start from scratch that recreates every table deletes)."""
        tables = {name: [cast(PostgresTable, sink) for cfg, sink in sinks if _postgres(cfg)]
                  for name, sinks in self.sinks.items()}
        settings = [cfg.settings for cfg, _ in self._each_sink() if _postgres(cfg)]
        if not settings:
            return None
        first = settings[0]
        assert isinstance(first, PostgresSnapshotSettings | PostgresAppendSettings)
        assert self.config.database_dsn is not None
        return PostgresOutputs(
            self.config.database_dsn, tables, pipeline=self.config.consumer_group,
            definition=self.config.pipeline, db_schema=first.db_schema,
            commit=self.config.postgres_commit, retry=first.retry,
            start_over=not resuming and all(getattr(s, "mode", None) == "replace"
                                            for s in settings))

    def _refuse_stale_saved_state(self) -> None:
        """A sink that saves state of its own at checkpoints (a live table) must have saved it
        for the checkpoint resumed from: the replay starts after it."""
        stale = [f"output {cfg.output!r} ({cfg.settings.kind} {_where(cfg)}) was saved for "
                 f"checkpoint #{saved}" for cfg, sink in self._each_sink()
                 if (saved := sink.saved_through()) is not None and saved < self._checkpointed]
        if stale:
            self._close_sinks()
            raise CheckpointError(
                f"{'; '.join(stale)}, older than the checkpoint resumed from (#"
                f"{self._checkpointed} in {self.config.checkpoint_location}); the transactions "
                "between cannot be replayed. Restore the state saved with that checkpoint, or "
                "start over from the topics (an empty checkpoint location, the saved state "
                "moved away)")

    def _refuse_earlier_output(self) -> None:
        """A run from scratch numbers its transactions from 1: a sink still holding an earlier
        run's transactions would ignore (snapshot) or duplicate (append) everything it gets."""
        stale = [f"output {cfg.output!r} ({cfg.settings.kind} {_where(cfg)}) holds transactions"
                 f" up to #{through}" for cfg, sink in self._each_sink()
                 if (through := sink.held_through())]
        committed = self._postgres.committed() if self._postgres is not None else None
        if committed:
            stale.insert(0, f"the progress row of pipeline {self.config.consumer_group!r} says "
                            f"its PostgreSQL outputs hold transactions up to #{committed}")
        if stale:
            self._close_sinks()
            raise EarlierOutputError(
                f"{'; '.join(stale)}, written by an earlier run, but this run starts from scratch"
                f" (no checkpoint or logged transaction in {self.config.checkpoint_location}). "
                "Restore that run's checkpoint location, or start the outputs over from the "
                "topics (`mode: replace` on every PostgreSQL sink, which also deletes the "
                "progress row; move files away), or write to new tables, files and topics")

    def _retrying(self, dependency: str, work: Callable[[], _T]) -> _T:
        """`work()`, retried with exponential backoff while `dependency` is unavailable (not
        ready meanwhile); ShutdownRequested if a stop is requested while waiting."""
        delay = self.config.retry_initial_backoff_s
        while True:
            try:
                result = work()
            except (SinkWriteError, KafkaSourceError) as exc:
                self.readiness.fail(dependency, str(exc).splitlines()[0])
                log.warning("%s unavailable, retrying in %.1fs: %s", dependency, delay, exc)
                if self._stop.wait(delay):
                    raise ShutdownRequested(f"stopped while {dependency} was unavailable"
                                            ) from exc
                delay = min(delay * 2, self.config.retry_max_backoff_s)
            else:
                self.readiness.ok(dependency)
                return result

    # ---- the stages ----------------------------------------------------------------------

    def run(self, until: Callable[[PipelineRunner], bool] | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            progress_interval: float = 2.0) -> Progress:
        """Run the stages until `until(self)` holds (checked while every stage is idle) or a stop
        is requested; forever without either. Compute runs in the calling thread; a failure of
        any stage stops them all and is raised here. A batch abandoned by a stop is left to
        recovery."""
        stages = self._stages = _Stages(self.config.batch_transactions, serving=True)
        threads = [threading.Thread(target=stages.guard(work), name=name, daemon=True)
                   for name, work in (("ingest", self._ingest), ("deliver", self._deliver),
                                      ("checkpoint", self._checkpoint_in_background))]
        for thread in threads:
            thread.start()
        last_report = time.monotonic()
        try:
            while not self._stop.is_set() and stages.failure is None:
                batch = stages.take_batch(timeout=0.1)
                if batch is not None:
                    self._compute(batch)
                elif until is not None and stages.idle() and until(self):
                    break
                now = time.monotonic()
                if on_progress is not None and now - last_report >= progress_interval:
                    on_progress(self.progress)
                    last_report = now
        except BaseException as exc:
            stages.fail(exc)
        finally:
            stages.computing_done.set()
            if stages.failure is not None:
                self._stop.set()  # no stage waits on a dependency for a run that is over
            threads[1].join()  # delivers what was computed, unless a stage failed
            stages.halt.set()
            for thread in (threads[2], threads[0]):
                thread.join()
        if isinstance(stages.failure, ShutdownRequested):
            log.warning("%s: the current batch is abandoned; the next start replays it",
                        stages.failure)
        elif stages.failure is not None:
            raise stages.failure
        return self.progress

    def _ingest(self) -> None:
        """Poll, decode and form transactions into the ready queue; between polls, run the
        other stages' calls to the input (it is not thread-safe). After a stop, only those
        calls, until the other stages are done."""
        stages = self._stages
        try:
            while not stages.halt.is_set():
                stages.serve_input(self.input)
                if self._stop.is_set() or stages.failure is not None:
                    stages.halt.wait(0.02)
                    continue
                started = time.monotonic()
                try:
                    fresh = self._retrying(self.input.name, lambda: self.input.poll(0.05))
                except ShutdownRequested:
                    continue
                self.readiness.started.set()
                stats = self.input.stats
                if stats.events != self.progress.events:
                    self.progress.stage_seconds["ingest"] += time.monotonic() - started
                self.progress.events, self.progress.bad_records = stats.events, stats.bad_records
                self.progress.incomplete_upstream = stats.incomplete_upstream
                self.progress.closed(stats.transactions, time.monotonic())
                for transaction in fresh:
                    # Never logged, a transaction not handed over is formed again at the next
                    # start, with the same number.
                    while not stages.offer(transaction):
                        stages.serve_input(self.input)
                        if self._stop.is_set() or stages.failure is not None:
                            break
        finally:
            stages.stop_serving(self.input)

    def _compute(self, batch: TransactionBatch) -> None:
        # Logged before any sink sees them: a recovery re-forms exactly these transactions.
        started = time.monotonic()
        self.checkpoints.log(batch.log_entries(after=self._logged_through))
        self._logged_through = max(self._logged_through, batch.last.number)
        self._crash.reached("log")
        changes = {name: table for name, table in batch.changes.items()
                   if name in self.engine.sources}
        t0 = time.monotonic()
        try:
            outputs = self.engine.process(changes) if changes else {}
        except ExpressionError:
            if len(batch) == 1:
                raise
            # Apply the transactions before the failing one: processing stops exactly at it.
            for transaction in batch.transactions:
                self._compute(TransactionBatch.of([transaction]))
            return
        t1 = time.monotonic()
        self.progress.spark_job_seconds.observe(t1 - t0)
        self.progress.engine_seconds += t1 - t0
        self.progress.spark_jobs = self.engine.totals.jobs
        self.progress.spark_stages = self.engine.totals.stages
        self.progress.state_index_bytes = self.engine.index_bytes
        self.progress.batch_transactions.observe(len(batch))
        self.progress.batch_changes.observe(batch.rows)
        self.progress.stage_seconds["compute"] += t1 - started
        self._stages.hand_over(_Computed(batch, outputs, self.engine.version()))

    def _deliver(self) -> None:
        """Write each computed batch to every sink (in parallel), then commit its offsets; in
        order, one batch at a time. Tell the sinks about checkpoints between batches."""
        stages = self._stages
        while True:
            self._announce_checkpoint()
            computed = stages.next_computed(timeout=0.1)
            if computed is None:
                if stages.computing_done.is_set() or stages.failure is not None:
                    return
                continue
            try:
                self._write(computed)
            except ShutdownRequested as exc:
                stages.fail(exc)
                return
            finally:
                stages.delivered()

    def _write(self, computed: _Computed) -> None:
        started = time.monotonic()
        writes: list[Callable[[], None]] = [
            partial(self._write_one, cfg, sink, table)
            for name, table in computed.outputs.items() if table.num_rows
            for cfg, sink in self.sinks.get(name, []) if not _postgres(cfg)]
        if self._postgres is not None:
            writes.append(partial(self._write_postgres, self._postgres, computed))
        for _ in self._sink_pool.map(lambda write: write(), writes):
            pass
        self.progress.output_changes += sum(t.num_rows for t in computed.outputs.values())
        self.progress.rejected_rows = {name: sum(sink.rejected_rows for _, sink in sinks)
                                       for name, sinks in self.sinks.items()}
        if self.live is not None:
            self.progress.live_table_bytes = self.live.nbytes()
            self.progress.live_subscribers = self.live.subscriber_count()
        commit_time = time.time()
        self.progress.sink_seconds += time.monotonic() - started
        self._crash.reached("commit")
        batch = computed.batch
        last = batch.last
        due = self._checkpoint_due()
        state = self._retrying(self.input.name, lambda: self._stages.call_input(
            self.input, lambda source: source.commit(batch, commit_time, with_state=due)))
        self._committed = (last.number, computed.version)
        self.progress.last_delivered_at = time.monotonic()
        self.progress.transactions += len(batch)
        self.progress.batches += 1
        self.progress.last_transaction = last.number
        self._batches_since_checkpoint += 1
        self.progress.stage_seconds["deliver"] += time.monotonic() - started
        if state is not None:
            self._batches_since_checkpoint = 0
            self._stages.checkpoint_jobs.put((last.number, state, computed.version))
        log.debug("batch of %d transactions done, last #%d", len(batch), last.number)

    def _write_one(self, cfg: SinkConfig, sink: Sink, table: pa.Table) -> None:
        started = time.monotonic()
        self._retrying(_dependency(cfg), lambda: sink.write(table))
        self.progress.sink_write_seconds.observe(time.monotonic() - started)
        self._crash.reached("sink_write")

    def _write_postgres(self, outputs: PostgresOutputs, computed: _Computed) -> None:
        """Every PostgreSQL output of the batch in one PostgreSQL transaction (or one per stream
        transaction) with the progress row, even when no table changes: the row says how far
        the tables are."""
        started = time.monotonic()
        marks = [Mark(t.number, (t.upstream_id,) if t.upstream_id is not None else (),
                      t.offsets) for t in computed.batch.transactions]
        self._retrying("postgresql", lambda: outputs.write(computed.outputs, marks))
        self.progress.sink_write_seconds.observe(time.monotonic() - started)
        self._crash.reached("sink_write")

    def _checkpoint_due(self) -> bool:
        """Whether to checkpoint as of the batch being committed (counted in); one checkpoint
        at a time: while one is written, later batches wait for the next occasion."""
        if self._stages.checkpointing.is_set():
            return False
        due = (self._batches_since_checkpoint + 1 >= self.config.checkpoint_every_batches
               or time.monotonic() - self._last_checkpoint >= self.config.checkpoint_every_s)
        if due:
            self._stages.checkpointing.set()
        return due

    def _checkpoint_in_background(self) -> None:
        stages = self._stages
        while True:
            try:
                number, state, version = stages.checkpoint_jobs.get(timeout=0.1)
            except queue.Empty:
                if stages.halt.is_set():
                    return
                continue
            try:
                self._save_checkpoint(number, state, version)
            except Exception:
                # The storage may be back by the next one; until then a crash replays more
                # (an incomplete checkpoint has no manifest and is never read).
                self.progress.checkpoint_failures += 1
                log.exception("checkpoint failed; retried after a later batch")
            finally:
                stages.checkpointing.clear()

    def _save_checkpoint(self, number: int, state: SourceState,
                         version: EngineVersion | None) -> None:
        started = time.monotonic()
        prepared = self.checkpoints.prepare(number, state)
        self.engine.save_state(self.checkpoints.engine_uri(prepared), version)
        for _, sink in self._each_sink():
            sink.before_checkpoint(number)
        self._crash.reached("checkpoint")
        self.checkpoints.publish(prepared)
        self._crash.reached("checkpointed")
        elapsed = time.monotonic() - started
        self._checkpointed = number
        self._last_checkpoint = time.monotonic()
        self.progress.checkpoints += 1
        self.progress.checkpoint_seconds.observe(elapsed)
        self.progress.stage_seconds["checkpoint"] += elapsed
        self.progress.last_checkpoint_transaction = number
        self.progress.last_checkpoint_at = self._last_checkpoint
        log.info("checkpoint through transaction #%d in %.2fs (%s)", number, elapsed,
                 prepared.name)

    def _announce_checkpoint(self) -> None:
        """Tell every sink the newest checkpointed transaction (from the thread that writes to
        them)."""
        number = self._checkpointed
        if number > self._announced:
            for _, sink in self._each_sink():
                sink.on_checkpoint(number)
            self._announced = number

    def checkpoint(self) -> bool:
        """Checkpoint through the last transaction every sink committed, if any since the last
        checkpoint; True if written. Call it while `run` is not running (e.g. after it returned,
        at a graceful stop): during a run, checkpoints are taken in the background."""
        number, version = self._committed
        if number == self._checkpointed:
            return False
        state = self._stages.call_input(self.input, lambda source: source.state())
        self._batches_since_checkpoint = 0
        self._save_checkpoint(number, state, version)
        self._announce_checkpoint()
        return True

    def lag(self) -> int:
        """Records in the source topics not yet in a committed transaction (measured now)."""
        return self.input.lag()

    def request_stop(self) -> None:
        """Make `run` return once the batches already computed are delivered (or at once,
        abandoning them, while a stage waits for an unavailable dependency). Safe from a signal
        handler or another thread."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._sink_pool.shutdown()
        self.input.close()
        self._close_sinks()

    def _each_sink(self) -> Iterator[tuple[SinkConfig, Sink]]:
        for sinks in self.sinks.values():
            yield from sinks

    def _close_sinks(self) -> None:
        if self._postgres is not None:
            self._postgres.close()
        for _, sink in self._each_sink():
            sink.close()


@dataclass(frozen=True)
class _Computed:
    """A batch the engine computed, on its way to the sinks, with the engine's state after it."""

    batch: TransactionBatch
    outputs: dict[str, pa.Table]
    version: EngineVersion


class _Stages:
    """The queues and signals between the stages of one `run`."""

    def __init__(self, batch_transactions: int, serving: bool) -> None:
        """`serving`: whether an ingest thread will run the other stages' calls to the input."""
        self.batch_transactions = batch_transactions
        # Closed transactions waiting for compute: at most one full batch.
        self._ready: queue.Queue[Transaction] = queue.Queue(maxsize=batch_transactions)
        # Computed batches waiting for the sinks: at most one.
        self._computed: queue.Queue[_Computed] = queue.Queue(maxsize=1)
        self._in_flight = 0  # handed over to deliver and not yet committed
        self._lock = threading.Lock()
        self.checkpoint_jobs: queue.Queue[tuple[int, SourceState, EngineVersion | None]] = \
            queue.Queue()
        self.checkpointing = threading.Event()  # a checkpoint is queued or being written
        self.computing_done = threading.Event()
        self.halt = threading.Event()  # every stage but ingest is done
        self.failure: BaseException | None = None
        self._calls: queue.Queue[tuple[Callable[[KafkaInput], Any], Future[Any]]] = \
            queue.Queue()
        self._serving = serving

    def guard(self, work: Callable[[], None]) -> Callable[[], None]:
        def guarded() -> None:
            try:
                work()
            except BaseException as exc:
                self.fail(exc)
        return guarded

    def fail(self, exc: BaseException) -> None:
        """The first failure stops every stage; `run` raises it."""
        with self._lock:
            if self.failure is None:
                self.failure = exc

    # ingest -> compute

    def offer(self, transaction: Transaction) -> bool:
        try:
            self._ready.put(transaction, timeout=0.02)
        except queue.Full:
            return False
        return True

    def take_batch(self, timeout: float) -> TransactionBatch | None:
        """Every transaction ready, up to a batch's worth, once at least one is (adaptive
        batching: one at low load, a full batch under a backlog)."""
        try:
            batch = [self._ready.get(timeout=timeout)]
        except queue.Empty:
            return None
        while len(batch) < self.batch_transactions:
            try:
                batch.append(self._ready.get_nowait())
            except queue.Empty:
                break
        return TransactionBatch.of(batch)

    # compute -> deliver

    def hand_over(self, computed: _Computed) -> None:
        with self._lock:
            self._in_flight += 1
        while True:
            if self.failure is not None:
                raise self.failure
            try:
                self._computed.put(computed, timeout=0.1)
                return
            except queue.Full:
                continue

    def next_computed(self, timeout: float) -> _Computed | None:
        try:
            return self._computed.get(timeout=timeout)
        except queue.Empty:
            return None

    def delivered(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def idle(self) -> bool:
        with self._lock:
            return self._in_flight == 0 and self._ready.empty()

    # other stages -> the input, through ingest

    def call_input(self, source: KafkaInput, work: Callable[[KafkaInput], _T]) -> _T:
        """`work(source)`, run by the ingest thread between two polls while it serves calls,
        else here (no other thread uses the input then)."""
        done: Future[_T] = Future()
        with self._lock:
            serving = self._serving
            if serving:
                self._calls.put((work, done))
        return done.result() if serving else work(source)

    def serve_input(self, source: KafkaInput) -> None:
        while True:
            try:
                work, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(work(source))
            except BaseException as exc:
                done.set_exception(exc)

    def stop_serving(self, source: KafkaInput) -> None:
        with self._lock:
            self._serving = False
        self.serve_input(source)
